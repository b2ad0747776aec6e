"""The settings of :class:`lrft.config.TrainConfig` for on-policy distillation and process
rewards (:class:`DistillFields`): the teacher, as a model folder or a service, the weight of its
advantage, whether the task reward is read, and the process reward model with its step
separator. The rules across them are :mod:`lrft.config.distill_checks`.

As for every field, the docstring is the flag's help (``lrft train --help``) and the metadata
the section that lists it (:mod:`lrft.config.flag_spec`).
"""

from __future__ import annotations

import attrs

from lrft.api import validators as v
from lrft.config import validators as f
from lrft.config.flag_spec import DISTILLATION, FlagGroup, flag
from lrft.config.rollout_fields import RolloutFields
from lrft.distill.protocols import TEACHER_PROTOCOLS


@attrs.frozen(kw_only=True)
class DistillFields(RolloutFields):
    """The distillation and process-reward fields of :class:`lrft.config.TrainConfig`, each
    checked on its own as it is set."""

    # on-policy distillation (lrft.algo.distillation, lrft.trainer.teacher) -----------------
    teacher_pretrain: str | None = attrs.field(default=None, metadata=DISTILLATION)
    """The teacher of on-policy distillation (``advantage_estimator`` on_policy_distillation or
    on_policy_distillation_hybrid): a model folder sharing the student's tokenizer (a
    vision-language model for a vision-language student), scored in process, frozen, sharded,
    offloaded and slept like the reference model."""
    teacher_url: str | None = attrs.field(
        default=None,
        validator=f.optional_http_url,
        repr=f.redacted_repr,
        metadata=DISTILLATION,
    )
    """A teacher service instead: per-token logprobs for given token ids, in
    ``teacher_protocol``'s format (:mod:`lrft.distill.protocols`). LightRFT passes its SGLang
    teacher as ``remote_rm_url``; here it is ``teacher_url`` URL with ``teacher_protocol``
    sglang. Credentials in it are hidden wherever lrft shows or saves the config."""
    teacher_protocol: str = attrs.field(
        default="lrft",
        validator=f.teacher_protocol,
        metadata=flag(FlagGroup.DISTILLATION, choices=tuple(TEACHER_PROTOCOLS)),
    )
    """The teacher service's format: lrft's, or sglang (SGLang's /generate, as LightRFT's
    teacher server speaks it); needs ``teacher_url``."""
    teacher_auth_env: str | None = attrs.field(
        default=None, metadata=flag(FlagGroup.DISTILLATION, metavar="VARIABLE")
    )
    """An environment variable whose value goes to the teacher service as 'Authorization:
    Bearer <value>' (the config holds the name only; needs ``teacher_url``)."""
    teacher_timeout_s: float = attrs.field(
        default=60.0, validator=v.positive_number, metadata=DISTILLATION
    )
    """Seconds each teacher request may take (needs ``teacher_url``)."""
    teacher_max_attempts: int = attrs.field(
        default=3, validator=v.positive_int, metadata=DISTILLATION
    )
    """Tries per request when the teacher service times out or answers 408, 429 or 5xx (needs
    ``teacher_url``)."""
    opd_kl_coef: float | None = attrs.field(
        default=None, validator=f.optional_positive_float, metadata=DISTILLATION
    )
    """The weight of the distillation advantage -coef x clamp(log p_student - log p_teacher,
    -20, 20) (unset: 1; read by the distillation estimators only)."""
    no_task_reward: bool = attrs.field(default=False, metadata=DISTILLATION)
    """Score no training sample with the task reward (on_policy_distillation learns from the
    teacher alone, and then needs no reward); evaluation still uses the reward when one is
    given."""
    # process rewards (lrft.rewards.process, lrft.trainer.process_rewards) ------------------
    prm_pretrain: str | None = attrs.field(default=None, metadata=DISTILLATION)
    """A process reward model: a token-classification folder of one label (or two) sharing the
    student's tokenizer, whose score at each step's end becomes a token reward there, beside the
    outcome reward (lrft train-rm --step_separator trains one)."""
    prm_step_separator: str | None = attrs.field(
        default=None,
        validator=f.optional_text,
        metadata=flag(FlagGroup.DISTILLATION, metavar="TEXT"),
    )
    """The text that ends each reasoning step of a response ($'\\n\\n' in bash); the last step
    ends with the response (needs ``prm_pretrain``)."""
