"""Teachers for on-policy distillation (:mod:`lrft.algo.distillation`), apart from the trainer.

- :mod:`lrft.distill.remote`: a teacher served over HTTP that returns per-token logprobs for
  given token ids (:class:`RemoteTeacher`, in lrft's format or SGLang's ``/generate``), under
  the rules of every lrft client of a service (:mod:`lrft.rewards.http_service`);
- :mod:`lrft.distill.tokenizers`: the check that a teacher (or a process reward model) reads
  the student's token ids as the student does.

The in-process teacher is a frozen model placed like the reference model
(:mod:`lrft.trainer.teacher`). ``RemoteTeacher`` needs ``httpx`` and the tokenizer check
transformers: each is imported from its own module, so that the config (which reads
the protocols' names) imports neither.
"""

from __future__ import annotations

from lrft.distill.protocols import TEACHER_PROTOCOLS, TeacherRequest

__all__ = ["TEACHER_PROTOCOLS", "TeacherRequest"]
