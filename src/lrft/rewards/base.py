"""The reward contract: samples in, one finite score per sample (plus named metrics) out.

:func:`compute_rewards` is the one call the trainer makes. It checks what a :class:`RewardFn`
returns and turns every failure into a :class:`RewardError` that names the reward and, whenever
one sample is to blame, its index in the batch: a reward that raises or returns NaN/inf is never
silently scored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import attrs
import torch

from lrft.api import validators as v
from lrft.api.errors import LrftError
from lrft.api.media import AudioClip, Image
from lrft.rewards._checks import name_validator


class RewardError(LrftError):
    """A reward could not be computed; names the reward and, when known, the sample's index."""

    def __init__(self, *, reward: str, detail: str, sample_index: int | None = None) -> None:
        self.reward = reward
        self.detail = detail
        self.sample_index = sample_index
        where = f" at sample {sample_index}" if sample_index is not None else ""
        super().__init__(f"reward {reward!r} failed{where}: {detail}")


def _image_tuple(images: Sequence[Image]) -> tuple[Image, ...]:
    return tuple(images)


def _audio_tuple(clips: Sequence[AudioClip]) -> tuple[AudioClip, ...]:
    return tuple(clips)


@attrs.frozen(kw_only=True)
class RewardSample:
    """One response to score.

    ``label`` names the kind of data the prompt came from (``"math"``, ``"format"``...): a
    :class:`~lrft.rewards.CombinedReward` routes on it. ``reference`` is the ground truth, when
    the data has one (the gold answer of a math problem). ``metadata`` carries anything else a
    reward needs (token counts, a task id; the trainer passes the prompt row's other columns);
    remote rewards send it as JSON. ``images`` are the prompt's images (PIL images or uint8
    ``(C, H, W)`` tensors), ``audio`` its audio clips (mono waveforms at the feature
    extractor's rate), for rewards that look at them (remote rewards send neither).
    """

    prompt: str
    response: str
    label: str = ""
    reference: str | None = None
    # Left out of the hash (a read-only mapping is not hashable); equality still compares it.
    metadata: Mapping[str, Any] = attrs.field(factory=dict, converter=v.read_only, hash=False)
    # Compared and hashed by identity: images are the prompt's own objects, not values.
    images: tuple[Image, ...] = attrs.field(
        default=(), converter=_image_tuple, eq=False, hash=False
    )
    audio: tuple[AudioClip, ...] = attrs.field(
        default=(), converter=_audio_tuple, eq=False, hash=False
    )


def _scores(value: torch.Tensor | Sequence[float]) -> tuple[float, ...]:
    if isinstance(value, torch.Tensor):
        if value.dim() != 1:
            raise ValueError(f"scores must be one-dimensional, got shape {tuple(value.shape)}")
        return tuple(float(x) for x in value.detach().to("cpu", torch.float64).tolist())
    if isinstance(value, str | bytes):
        raise TypeError(f"scores must be a sequence of numbers, got {value!r}")
    return tuple(float(x) for x in value)


def _metrics(
    value: Mapping[str, torch.Tensor | Sequence[float]],
) -> Mapping[str, tuple[float, ...]]:
    return MappingProxyType({str(name): _scores(values) for name, values in value.items()})


@attrs.frozen(kw_only=True)
class RewardOutput:
    """What a reward returns for a batch: ``scores[i]`` belongs to the ``i``-th sample.

    ``metrics`` are named per-sample values for logging (``"extracted"``, ``"timeout"``...), each
    as long as ``scores``; NaN in a metric means "not measured for this sample" (a combined reward
    fills it in where a part did not run). Scores may be given as a 1-D tensor or any sequence of
    numbers; they are stored as a tuple of floats so the value is immutable and comparable.
    Finiteness is checked by :func:`compute_rewards`, which knows the reward's name.
    """

    scores: tuple[float, ...] = attrs.field(converter=_scores)
    metrics: Mapping[str, tuple[float, ...]] = attrs.field(
        factory=dict, converter=_metrics, hash=False
    )

    def __attrs_post_init__(self) -> None:
        for name, values in self.metrics.items():
            if not name:
                raise ValueError("metric names must not be empty")
            if len(values) != len(self.scores):
                raise ValueError(
                    f"metric {name!r} has {len(values)} values for {len(self.scores)} scores; "
                    "every metric needs one value per sample"
                )

    def __len__(self) -> int:
        return len(self.scores)

    def scores_tensor(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The scores as a 1-D tensor on the CPU."""
        return torch.tensor(self.scores, dtype=dtype)


@runtime_checkable
class RewardFn(Protocol):
    """A reward over a batch of samples.

    ``name`` identifies the reward in errors and metric names, so it is short and stable. The call
    returns a :class:`RewardOutput` with exactly one score per sample, in order. Scores must be
    finite; a reward that cannot score a sample raises (it never returns NaN or a made-up value
    for it). Call rewards through :func:`compute_rewards`, which enforces this contract and names
    the sample at fault. A reward may see the same sample again: when a batch raises anything but
    an lrft error, :func:`compute_rewards` re-runs the samples one by one to find the culprit. A
    reward for which that is wrong (its forward is collective across ranks, or a call is costly)
    reports its own failures as :class:`RewardError`.

    Implementations are structural: anything with ``name`` and this ``__call__`` is a reward.
    """

    @property
    def name(self) -> str: ...

    # Positional-only: an implementation may name its parameter as it likes.
    def __call__(self, samples: Sequence[RewardSample], /) -> RewardOutput: ...


def compute_rewards(reward: RewardFn, samples: Sequence[RewardSample]) -> RewardOutput:
    """Call ``reward`` on ``samples`` and check the result; the trainer's only way to score.

    Raises :class:`RewardError` naming ``reward.name`` when the call raises, returns something
    other than a :class:`RewardOutput`, returns the wrong number of scores, or returns a score
    that is NaN or infinite (naming the first such sample). When a batch call raises, each
    sample is scored alone to find the one that raises; lrft's own errors (a
    :class:`RewardError` from the reward itself, a ``ConfigError``) are passed on as they are,
    since they already say what failed. A reward whose call must not be repeated on one rank
    alone (a collective forward) raises :class:`RewardError` itself.
    """
    name = reward.name
    samples = list(samples)
    try:
        output = reward(samples)
    except LrftError:
        raise  # a deliberate error (RewardError, ConfigError...) already says what failed
    except Exception as error:
        raise _locate_failure(reward, samples, error) from error
    if not isinstance(output, RewardOutput):
        raise RewardError(
            reward=name, detail=f"returned {type(output).__name__}, not a RewardOutput"
        )
    if len(output) != len(samples):
        raise RewardError(
            reward=name, detail=f"returned {len(output)} scores for {len(samples)} samples"
        )
    for index, score in enumerate(output.scores):
        if not math.isfinite(score):
            raise RewardError(
                reward=name,
                sample_index=index,
                detail=f"returned a non-finite score ({score!r}); scores must be finite",
            )
    return output


def _describe(error: BaseException) -> str:
    return f"raised {type(error).__name__}: {error}"


def _locate_failure(reward: RewardFn, samples: list[RewardSample], error: Exception) -> RewardError:
    if len(samples) == 1:
        return RewardError(reward=reward.name, sample_index=0, detail=_describe(error))
    for index, sample in enumerate(samples):
        try:
            reward([sample])
        except Exception as alone:
            return RewardError(reward=reward.name, sample_index=index, detail=_describe(alone))
    return RewardError(
        reward=reward.name,
        detail=f"{_describe(error)} on a batch of {len(samples)} samples, "
        "and no sample alone raises",
    )


@attrs.frozen(kw_only=True)
class PerSampleReward:
    """A :class:`RewardFn` from a function that scores one sample.

    The way to plug in a plain Python function (``--reward_fn module:function``)::

        def exact(sample: RewardSample) -> float:
            return float(sample.response.strip() == sample.reference)

        reward = PerSampleReward(name="exact", score=exact)

    An exception from ``score`` becomes a :class:`RewardError` naming the sample's index.
    """

    name: str = attrs.field(validator=name_validator)
    score: Callable[[RewardSample], float]

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        scores = []
        for index, sample in enumerate(samples):
            try:
                scores.append(float(self.score(sample)))
            except Exception as error:
                raise RewardError(
                    reward=self.name, sample_index=index, detail=_describe(error)
                ) from error
        return RewardOutput(scores=scores)
