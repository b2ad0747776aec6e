"""Value types shared by every backend: requests, results, reports and memory states.

All are attrs classes, frozen and keyword-only, validated at construction so that a bad value is
reported where it is made, with the field and the rule, not deep inside an engine.
"""

from __future__ import annotations

import enum
from typing import Literal

import attrs
import torch

from lrft.api import validators as v
from lrft.api.media import MediaInputs


@attrs.frozen(kw_only=True)
class SamplingParams:
    """How to sample completions; the same meaning on every engine.

    ``temperature == 0`` is greedy decoding (top-k/top-p are then irrelevant). Generation stops
    after ``max_new_tokens`` tokens or at the first token in ``stop_token_ids`` (which is kept in
    the output); engines add no stop tokens of their own, so pass the tokenizer's EOS here. No
    stop token is emitted before ``min_new_tokens`` tokens. ``seed`` makes sampling reproducible:
    the same requests, parameters and seed give the same samples. ``return_logprobs`` asks for
    the log-probability of each generated token under ``log_softmax(logits / T)`` where ``T`` is
    the temperature (1 when greedy), before any top-k/top-p truncation.
    """

    n: int = attrs.field(default=1, validator=v.positive_number)
    temperature: float = attrs.field(default=1.0, validator=[v.finite, v.non_negative])
    top_p: float = attrs.field(default=1.0, validator=v.unit_interval_open_closed)
    top_k: int = attrs.field(default=0, validator=v.non_negative)
    max_new_tokens: int = attrs.field(default=128, validator=v.positive_number)
    min_new_tokens: int = attrs.field(default=0, validator=v.non_negative)
    stop_token_ids: tuple[int, ...] = attrs.field(
        default=(), converter=v.int_tuple, validator=v.non_negative_ints
    )
    seed: int | None = None
    return_logprobs: bool = False

    def __attrs_post_init__(self) -> None:
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens "
                f"({self.max_new_tokens})"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@attrs.frozen(kw_only=True)
class GenerationRequest:
    """One prompt as token ids, with its media (images, audio) when it has any.

    ``media``: the prompt's :class:`~lrft.api.media.MediaInputs`. When they are processed,
    ``prompt_token_ids`` must be their expanded ids (the placeholders the model's processor
    wrote, one per feature). An engine refuses a request whose modalities it does not declare
    (``CapabilityNotSupported``), before any work.

    ``max_new_tokens``, when set, caps this request's completions below the call's
    ``SamplingParams.max_new_tokens`` (a per-request budget, e.g. what is left of a multi-turn
    conversation's): each of its samples gets at most ``min(max_new_tokens,
    params.max_new_tokens)`` tokens, ending with ``finish_reason == "length"`` there, and
    ``min_new_tokens`` applies up to that cap. ``capped(params)`` is the call's parameters as
    they apply to this request.
    """

    prompt_token_ids: tuple[int, ...] = attrs.field(
        converter=v.int_tuple, validator=v.non_negative_ints
    )
    request_id: str = ""
    media: MediaInputs | None = None
    max_new_tokens: int | None = attrs.field(default=None, validator=v.optional(v.positive_int))

    def __attrs_post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"prompt_token_ids must not be empty (request {self.request_id!r})")
        processed = None if self.media is None else self.media.processed
        if processed is not None and processed.prompt_token_ids != self.prompt_token_ids:
            raise ValueError(
                f"request {self.request_id!r}: prompt_token_ids ({len(self.prompt_token_ids)} "
                f"tokens) are not the processed media's expanded prompt "
                f"({len(processed.prompt_token_ids)} tokens); pass the processor's ids"
            )

    def capped(self, params: SamplingParams) -> SamplingParams:
        """``params`` with this request's ``max_new_tokens`` applied (``params`` itself when
        the request has no cap or a cap at or above it)."""
        if self.max_new_tokens is None or self.max_new_tokens >= params.max_new_tokens:
            return params
        return attrs.evolve(
            params,
            max_new_tokens=self.max_new_tokens,
            min_new_tokens=min(params.min_new_tokens, self.max_new_tokens),
        )


FinishReason = Literal["stop", "length"]


@attrs.frozen(kw_only=True)
class GenerationResult:
    """One sampled completion of one request.

    ``generate`` returns ``len(requests) * n`` results, request-major: the ``j``-th sample of the
    ``i``-th request is at index ``i * n + j`` and has ``sample_index == j``.
    """

    request_id: str
    sample_index: int
    prompt_token_ids: tuple[int, ...] = attrs.field(converter=v.int_tuple)
    output_token_ids: tuple[int, ...] = attrs.field(converter=v.int_tuple)
    finish_reason: FinishReason
    logprobs: tuple[float, ...] | None = None

    def __attrs_post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.output_token_ids):
            raise ValueError(
                f"logprobs has {len(self.logprobs)} entries for "
                f"{len(self.output_token_ids)} output tokens"
            )


class ModelPart(enum.Enum):
    """The parts of a trained model whose memory a backend can move between phases."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER = "optimizer"


class Location(enum.Enum):
    DEVICE = "device"
    HOST = "host"


@attrs.frozen(kw_only=True)
class Placement:
    """Where each part of a wrapped model lives now."""

    parameters: Location
    gradients: Location
    optimizer: Location

    def of(self, part: ModelPart) -> Location:
        location: Location = getattr(self, part.value)
        return location


@attrs.frozen(kw_only=True)
class StepReport:
    """What one ``step()`` did.

    ``skipped`` is true when the gradient norm was not finite: then no parameter, optimizer or
    scheduler state changed and ``optimizer_steps`` did not advance.
    """

    optimizer_steps: int
    grad_norm: float
    skipped: bool
    lr: float


class EnginePart(enum.Enum):
    """The memory regions of a rollout engine that sleep releases and wake restores."""

    WEIGHTS = "weights"
    KV_CACHE = "kv_cache"


class WeightsResidency(enum.Enum):
    RESIDENT = "resident"  # on the device, usable
    PARKED = "parked"  # on the host (sleep level 1): waking restores them bit-exactly
    RELEASED = "released"  # discarded (sleep level 2): waking gives stale memory to load into


@attrs.frozen(kw_only=True)
class EngineState:
    """An engine's memory state and whether its weights are a verified, complete version.

    ``weights_version`` is ``None`` while the weights are stale: after waking from level 2, while
    an update is in flight, or after an update failed.
    """

    weights: WeightsResidency
    kv_cache_resident: bool
    weights_version: int | None
    sleep_level: int = attrs.field(validator=attrs.validators.in_((0, 1, 2)))

    @property
    def awake(self) -> bool:
        return self.weights is WeightsResidency.RESIDENT and self.kv_cache_resident

    @property
    def stale(self) -> bool:
        return self.weights_version is None


@attrs.frozen(kw_only=True)
class TensorSpec:
    """Shape and dtype an engine expects for one named weight."""

    shape: tuple[int, ...] = attrs.field(converter=v.int_tuple)
    dtype: torch.dtype


@attrs.frozen(kw_only=True)
class SyncReport:
    """What one weight sync moved, how long it took and what it verified.

    ``verified``: the sync compared digests (what its ``verifies_digest`` capability declares).
    ``digest``: ``combine_digests`` of the digests of what was sent, each tensor cast to the
    engine's dtype for it; empty where the sync computed none. A sync that sent only the
    changed weights (``unchanged > 0``) reports the digest of every weight the engine holds: the
    ones sent now and the ones it left in place, as they were sent before.
    ``tensors`` and ``bytes`` count what this sync sent; ``unchanged`` the weights it left in
    place because the engine still held them (see ``IncrementalWeightSource``).
    """

    version: int
    tensors: int
    bytes: int
    buckets: int
    seconds: float
    verified: bool
    digest: str
    unchanged: int = 0


@attrs.frozen(kw_only=True)
class WeightsMark:
    """What an ``IncrementalWeightSource``'s weights were at one pass, as a receiver needs to
    know which of them it must take again.

    ``varying``: the Hugging Face names of the weights that training changes (those computed
    from parameters that require grad: with LoRA, the merged weights of the adapted modules).
    ``frozen_digest``: a fingerprint of every other weight's parameters on every rank; equal
    fingerprints mean those weights did not change.
    """

    varying: frozenset[str]
    frozen_digest: str


@attrs.frozen(kw_only=True)
class WeightsUpdate:
    """A source's answer to ``weights_mark``: the mark of its weights now, and whether every
    rank's receiver can be brought up to date with the varying weights alone."""

    mark: WeightsMark
    varying_only: bool
