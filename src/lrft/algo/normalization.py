"""The one advantage normalisation stage.

Step 4 of an RL iteration (docs/trainer.md, "One iteration"): an estimator produces raw advantages,
then :func:`normalize_advantages` whitens them over the batch if and only if the estimator's
registration says ``whiten=True``. It marks its output ``normalized`` and refuses an input that
is already marked, so no path can whiten twice. Nothing else in lrft rescales advantages: the
policy losses take them as given.

Whitening: ``A' = (A - mean) / (std + eps)`` over every valid token of the batch, ``std`` with
Bessel's correction, computed in float64. Under data parallelism the batch is global: pass
``reduce_moments`` (or ``moments``) so that every rank whitens with the statistics of all ranks.

A batch whose advantages agree to within the rounding resolution of their dtype
(:meth:`RunningMoments.below_resolution`) carries no signal and whitens to exactly 0: dividing
its rounding noise by a standard deviation of the same size would make advantages of order one.
The statistics are global, so every rank takes the same decision.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from lrft.algo._tensor import fill_masked
from lrft.algo.registry import advantage_estimators
from lrft.algo.running_moments import RunningMoments
from lrft.algo.types import AdvantageParams, Advantages, RewardBatch
from lrft.api.errors import ConfigError

DEFAULT_WHITEN_EPS = 1e-8


def advantage_moments(result: Advantages) -> RunningMoments:
    """Statistics of ``result``'s advantages over its valid tokens (one rank's share)."""
    return RunningMoments.from_values(result.advantages[result.action_mask])


def normalize_advantages(
    result: Advantages,
    *,
    whiten: bool,
    moments: RunningMoments | None = None,
    eps: float = DEFAULT_WHITEN_EPS,
) -> Advantages:
    """The normalisation stage: whiten when ``whiten`` is true, and mark the result normalised.

    ``moments`` are the whitening statistics; by default those of ``result`` itself. A batch they
    find :meth:`~RunningMoments.below_resolution` whitens to exactly 0. Returns are never
    rescaled (they are the critic's regression target). Raises ``ValueError`` if ``result``
    already went through this stage.
    """
    if result.normalized:
        raise ValueError(
            "advantages were already normalised; the normalisation stage runs exactly once"
        )
    if not whiten:
        return attrs.evolve(result, normalized=True)
    stats = advantage_moments(result) if moments is None else moments
    advantages = result.advantages
    if stats.below_resolution(advantages.dtype):
        whitened = torch.zeros_like(advantages)
    else:
        scale = stats.sample_std + eps
        whitened = ((advantages.to(torch.float64) - stats.mean) / scale).to(advantages.dtype)
    return attrs.evolve(
        result, advantages=fill_masked(whitened, result.action_mask), normalized=True
    )


def compute_advantages(
    estimator: str,
    batch: RewardBatch,
    params: AdvantageParams | None = None,
    *,
    reduce_moments: Callable[[RunningMoments], RunningMoments] | None = None,
    eps: float = DEFAULT_WHITEN_EPS,
) -> Advantages:
    """Run the registered ``estimator`` on ``batch`` and then the normalisation stage once.

    ``reduce_moments`` receives this rank's whitening statistics and returns the global ones
    (for example: ``all_gather`` the :meth:`RunningMoments.to_tensor` records and
    :meth:`RunningMoments.merge_all` them). It is called only for estimators that whiten.
    Raises ``ConfigError`` for an unknown name or for inputs the estimator declares it needs.
    """
    spec = advantage_estimators.get(estimator)
    if spec.needs_values and batch.values is None:
        raise ConfigError(f"advantage estimator {estimator!r} needs critic values; none were given")
    if spec.needs_groups and batch.group_ids is None:
        raise ConfigError(
            f"advantage estimator {estimator!r} needs prompt groups (group_ids or group_size)"
        )
    if spec.needs_teacher and (batch.logprobs is None or batch.teacher_logprobs is None):
        raise ConfigError(
            f"advantage estimator {estimator!r} needs the student's and a teacher's logprobs "
            "(RewardBatch.logprobs and RewardBatch.teacher_logprobs)"
        )
    raw = spec.fn(batch, AdvantageParams() if params is None else params)
    if raw.normalized:
        raise ValueError(
            f"advantage estimator {estimator!r} returned advantages marked normalised; estimators "
            f"return raw advantages and declare whiten= at registration instead"
        )
    moments = None
    if spec.whiten and reduce_moments is not None:
        moments = reduce_moments(advantage_moments(raw))
    return normalize_advantages(raw, whiten=spec.whiten, moments=moments, eps=eps)
