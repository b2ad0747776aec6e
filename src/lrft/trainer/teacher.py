"""The teacher of on-policy distillation (:mod:`lrft.algo.distillation`) as the trainer runs it.

``--teacher_pretrain PATH``: a frozen model wrapped by the train backend like the reference
model (sharded by FSDP2 or ZeRO-3, its parameters on the host outside its phase with
``--enable_engine_sleep``), scored by the same logprob pass as the actor and the reference, at
the sampling temperature (FIRE's first-token temperature included): :class:`ModelTeacher`.
``--teacher_url URL``: a service returning per-token logprobs for the rows' token ids
(:class:`ServiceTeacher`, through :class:`lrft.distill.remote.RemoteTeacher`).

Either way the teacher reads the student's token ids, so it must share the student's tokenizer:
:func:`check_teacher_settings` refuses one that does not before any process group starts (with
the teacher folder's other checks and the service's token variable).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import attrs
import torch
from torch import Tensor

from lrft.api.errors import ConfigError
from lrft.api.protocols import FrozenModel, TrainBackend
from lrft.config import TrainConfig
from lrft.config.inputs import check_model_folder
from lrft.distill import TeacherRequest
from lrft.distill.tokenizers import check_same_tokenizer
from lrft.models.media import keep_vision_tower_running, load_generative_model
from lrft.models.packed_attention import use_packed_attention
from lrft.trainer.sequences import Sequences

if TYPE_CHECKING:
    from lrft.distill.remote import RemoteTeacher


class Teacher(Protocol):
    """What the ``teacher_logprobs`` phase calls: every rank calls it once per iteration
    (a sharded teacher's forward is collective)."""

    def logprobs(self, sequences: Sequences) -> Tensor:
        """(B, T) on the CPU: the teacher's logprob of each response token, 0 at padding."""
        ...


@attrs.frozen(kw_only=True, eq=False)
class ModelTeacher:
    """A frozen model scored by ``score`` (the experience maker's micro-batched logprob pass)."""

    model: FrozenModel
    score: Callable[[FrozenModel, Sequences], Tensor]

    def logprobs(self, sequences: Sequences) -> Tensor:
        return self.score(self.model, sequences)


@attrs.frozen(kw_only=True, eq=False)
class ServiceTeacher:
    """A teacher service (:class:`lrft.distill.remote.RemoteTeacher`) asked for each row's
    response tokens at the sampling ``temperature``; one POST per call, from each rank."""

    service: RemoteTeacher
    temperature: float

    def logprobs(self, sequences: Sequences) -> Tensor:
        lengths = sequences.attention_mask.sum(-1).tolist()
        starts = sequences.prompt_lengths.tolist()
        requests = [
            TeacherRequest(
                token_ids=sequences.input_ids[row, :length].tolist(), response_start=start
            )
            for row, (length, start) in enumerate(zip(lengths, starts, strict=True))
        ]
        rows = self.service.logprobs(requests, temperature=self.temperature)
        mask = sequences.action_mask
        values = torch.zeros(mask.shape, dtype=torch.float32)
        for row, scored in enumerate(rows):
            # a response's t-th token is the (prompt length + t)-th of its row; the mask drops
            # what is not the model's own (an episode's observations)
            width = min(len(scored), mask.shape[1])
            values[row, :width] = torch.tensor(scored[:width], dtype=torch.float32)
        return values.masked_fill(~mask, 0.0)


def teacher_headers(config: TrainConfig) -> dict[str, str]:
    variable = config.teacher_auth_env
    if variable is None:
        return {}
    return {"Authorization": f"Bearer {os.environ[variable]}"}


def check_teacher_settings(config: TrainConfig) -> None:
    """The teacher folder is a generative model folder sharing the student's tokenizer (and a
    vision- or audio-language model where the prompts carry media); the service's token
    variable is set. Raises ``ConfigError`` naming the flag."""
    assert config.pretrain is not None
    if config.teacher_auth_env is not None:
        value = os.environ.get(config.teacher_auth_env)
        if not value or any(character in value for character in "\r\n\0"):
            raise ConfigError(
                f"--teacher_auth_env {config.teacher_auth_env}: the variable is not set, empty, "
                "or holds a line break (it carries the teacher service's token; set it on every "
                "node)"
            )
    path = config.teacher_pretrain
    if path is None:
        return
    check_model_folder("teacher_pretrain", path, tokenizer=True)
    check_same_tokenizer(config.pretrain, path, flag="teacher_pretrain")
    teacher = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    for key, tower in (("images_key", "vision_config"), ("audios_key", "audio_config")):
        if getattr(config, key) is not None and tower not in teacher:
            raise ConfigError(
                f"teacher_pretrain {path!r} ({teacher.get('model_type', 'unknown type')}) has no "
                f"{tower}: the prompts carry media ({key}), so the teacher must read them too"
            )


def load_teacher_model(config: TrainConfig, backend: TrainBackend) -> FrozenModel | None:
    """``teacher_pretrain``'s model in fp32, wrapped by ``backend`` like the reference model
    (routed through packed attention with ``packing_samples``: it is scored by the same packed,
    and split, forward); ``None`` without ``teacher_pretrain``. Collective (the backend shards
    it)."""
    if config.teacher_pretrain is None:
        return None
    model = load_generative_model(
        config.teacher_pretrain,
        dtype=torch.float32,
        attn_implementation=config.attn_implementation,
    )
    keep_vision_tower_running(model)  # as the actor's: sharded ranks' collectives must match
    if config.packing_samples:
        use_packed_attention(model)
    return backend.prepare_frozen(model)


def service_teacher(config: TrainConfig) -> ServiceTeacher:
    """The teacher service ``teacher_url`` names, asked at the sampling temperature."""
    from lrft.distill.remote import RemoteTeacher

    assert config.teacher_url is not None
    service = RemoteTeacher(
        url=config.teacher_url,
        protocol=config.teacher_protocol,
        timeout_s=config.teacher_timeout_s,
        max_attempts=config.teacher_max_attempts,
        headers=teacher_headers(config),
    )
    return ServiceTeacher(service=service, temperature=config.temperature)


def make_teacher(
    config: TrainConfig,
    model: FrozenModel | None,
    score: Callable[[FrozenModel, Sequences], Tensor],
) -> Teacher | None:
    """The run's teacher: ``model`` (``teacher_pretrain``'s, wrapped) scored by ``score``, the
    ``teacher_url`` service, or ``None`` for an estimator that reads no teacher."""
    if model is not None:
        return ModelTeacher(model=model, score=score)
    if config.teacher_url is not None:
        return service_teacher(config)
    return None
