"""A reward from a function of whole batches, called by LightRFT's argument names.

LightRFT's custom reward is ``reward_fn(responses, labels)``: lists in, one score per response
out. :class:`BatchFunctionReward` calls such a function with the lists its parameters name, from
:data:`BATCH_ARGUMENTS`, and accepts what LightRFT's functions return: a list or a 1-D tensor of
scores, or ``(scores, metrics)`` with a mapping of named per-sample values.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence

import attrs
import torch

from lrft.rewards._checks import name_validator
from lrft.rewards.base import RewardOutput, RewardSample

BATCH_ARGUMENTS: dict[str, Callable[[RewardSample], object]] = {
    "responses": lambda s: s.response,
    "labels": lambda s: s.label,
    "prompts": lambda s: s.prompt,
    "queries": lambda s: s.prompt + s.response,
    "references": lambda s: s.reference,
    "refs": lambda s: s.reference,
}
"""The parameter names a batch function may have, and what each receives per sample: the
response text, the data label (``label_key``), the prompt text, prompt and response joined
(LightRFT's and OpenRLHF's ``queries``), the reference answer (``reference_key``; ``None`` when
there is none)."""


def batch_parameters(function: Callable[..., object]) -> tuple[str, ...] | None:
    """The names :class:`BatchFunctionReward` would pass ``function``, when every parameter it
    requires is in :data:`BATCH_ARGUMENTS` and one of them is ``responses`` or ``queries``;
    ``None`` otherwise (a function of one sample, say)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin or extension callable without a signature
        return None
    required = [p.name for p in parameters if p.default is inspect.Parameter.empty]
    named = [p.name for p in parameters if p.name in BATCH_ARGUMENTS]
    if not set(required) <= set(named) or not {"responses", "queries"} & set(named):
        return None
    return tuple(named)


@attrs.frozen(kw_only=True)
class BatchFunctionReward:
    """A :class:`~lrft.rewards.RewardFn` from ``score(responses=..., labels=..., ...)``; its
    ``arguments`` are the names it is called with (:func:`batch_parameters`)."""

    name: str = attrs.field(validator=name_validator)
    score: Callable[..., object]
    arguments: tuple[str, ...]

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        values = {
            argument: [BATCH_ARGUMENTS[argument](s) for s in samples] for argument in self.arguments
        }
        result = self.score(**values)
        metrics: Mapping[str, Sequence[float] | torch.Tensor] = {}
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Mapping):
            result, metrics = result
        if not isinstance(result, torch.Tensor | Sequence):
            raise TypeError(
                f"returned a {type(result).__name__}; a batch reward returns one score per "
                "response (a list or a 1-D tensor), or (scores, metrics)"
            )
        return RewardOutput(scores=result, metrics=metrics)
