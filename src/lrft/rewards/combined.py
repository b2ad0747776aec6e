"""Weighted combination of rewards, chosen per sample by its data label."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from lrft.api.validators import finite
from lrft.rewards._checks import name_validator
from lrft.rewards.base import RewardError, RewardFn, RewardOutput, RewardSample, compute_rewards


@attrs.frozen(kw_only=True)
class Weighted:
    """One part of a combined reward: ``weight * reward``."""

    reward: RewardFn = attrs.field(validator=attrs.validators.instance_of(RewardFn))  # type: ignore[type-abstract]  # a runtime-checkable Protocol is a valid isinstance target
    weight: float = attrs.field(default=1.0, validator=finite)


def _routes(value: Mapping[str, Sequence[Weighted]]) -> Mapping[str, tuple[Weighted, ...]]:
    return {str(label): tuple(parts) for label, parts in value.items()}


@attrs.frozen(kw_only=True, eq=False)
class CombinedReward:
    """For a sample labelled ``L``: the sum of ``weight * score`` over ``routes[L]``.

    Example: math problems scored on correctness plus a small format bonus, format drills on the
    format alone::

        CombinedReward(routes={
            "math": [Weighted(reward=math, weight=1.0), Weighted(reward=fmt, weight=0.1)],
            "format": [Weighted(reward=fmt)],
        })

    Each distinct reward is called once per batch, on the samples whose label routes to it (an
    empty list when none does: a reward whose forward is collective across ranks runs on every
    rank alike), and through :func:`compute_rewards`, so a failure names the part and the
    sample's index in the whole batch. A label with no route raises :class:`RewardError` naming it and the known
    labels, before any reward runs. Metrics: ``<part>`` is the part's unweighted score and
    ``<part>/<metric>`` its metrics, NaN for samples the part did not score.
    """

    routes: Mapping[str, tuple[Weighted, ...]] = attrs.field(converter=_routes)
    name: str = attrs.field(default="combined", validator=name_validator)

    def __attrs_post_init__(self) -> None:
        if not self.routes:
            raise ValueError("routes must map at least one label to its rewards")
        names: dict[str, RewardFn] = {}
        for label, parts in self.routes.items():
            if not parts:
                raise ValueError(f"routes[{label!r}] is empty; every label needs a reward")
            for part in parts:
                if not isinstance(part, Weighted):
                    raise TypeError(
                        f"routes[{label!r}] must hold Weighted parts, got {type(part).__name__}"
                    )
                # Names key the metrics: two different rewards under one name would mix.
                known = names.setdefault(part.reward.name, part.reward)
                if known is not part.reward:
                    raise ValueError(
                        f"two different rewards are named {part.reward.name!r}; "
                        "names must be unique within a combined reward"
                    )

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(sorted(self.routes))

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        samples = list(samples)
        for index, sample in enumerate(samples):
            if sample.label not in self.routes:
                raise RewardError(
                    reward=self.name,
                    sample_index=index,
                    detail=f"label {sample.label!r} has no reward; known labels: "
                    f"{list(self.labels)}",
                )
        # Which samples each distinct reward scores (a reward shared by labels runs once).
        parts: dict[int, RewardFn] = {}
        members: dict[int, list[int]] = {}
        for label in self.labels:
            for part in self.routes[label]:
                parts.setdefault(id(part.reward), part.reward)
                members.setdefault(id(part.reward), [])
        for index, sample in enumerate(samples):
            for part in self.routes[sample.label]:
                members[id(part.reward)].append(index)

        totals = [0.0] * len(samples)
        metrics: dict[str, list[float]] = {}
        for key, reward in parts.items():
            indices = members[key]
            output = self._score_part(reward, samples, indices)
            scored = metrics.setdefault(reward.name, [math.nan] * len(samples))
            for position, index in enumerate(indices):
                scored[index] = output.scores[position]
            for metric, values in output.metrics.items():
                column = metrics.setdefault(f"{reward.name}/{metric}", [math.nan] * len(samples))
                for position, index in enumerate(indices):
                    column[index] = values[position]
        for index, sample in enumerate(samples):
            for part in self.routes[sample.label]:
                totals[index] += part.weight * metrics[part.reward.name][index]
        return RewardOutput(scores=totals, metrics=metrics)

    def _score_part(
        self, reward: RewardFn, samples: list[RewardSample], indices: list[int]
    ) -> RewardOutput:
        try:
            return compute_rewards(reward, [samples[i] for i in indices])
        except RewardError as error:
            if error.sample_index is None:
                raise
            # The index is into the sub-batch the part saw; report it in this reward's batch.
            raise RewardError(
                reward=error.reward, sample_index=indices[error.sample_index], detail=error.detail
            ) from error
