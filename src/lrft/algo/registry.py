"""Typed registries of advantage estimators, policy losses and KL estimators, keyed by CLI name.

A registry maps the name a user types (``--advantage_estimator group_norm``) to a record that
holds the function and what the trainer must know about it, as data: whether the estimator wants
batch whitening afterwards, whether it needs critic values or prompt groups, whether a loss is
sequence-level. Adding an algorithm is registering a function; nothing is subclassed.

Example: an estimator whose baseline is the best score of the prompt's group, registered with the
decorator form (``register_advantage_estimator("max_baseline", max_baseline, whiten=False,
needs_groups=True)`` is the call form)::

    import torch
    from lrft.algo import (
        AdvantageParams,
        Advantages,
        RewardBatch,
        broadcast_to_tokens,
        compute_advantages,
        register_advantage_estimator,
    )

    @register_advantage_estimator("max_baseline", whiten=False, needs_groups=True)
    def max_baseline(batch: RewardBatch, params: AdvantageParams) -> Advantages:
        '''A_i = s_i - max_{j in group(i)} s_j: only a prompt's best responses go unpunished.'''
        assert batch.group_ids is not None  # needs_groups=True is checked before the call
        scores = batch.sequence_scores
        _, group = torch.unique(batch.group_ids, return_inverse=True)
        best = torch.full((int(group.max()) + 1,), -torch.inf, dtype=scores.dtype)
        best = best.scatter_reduce(0, group, scores, reduce="amax")
        per_token = broadcast_to_tokens(scores - best[group], batch.action_mask)
        return Advantages(advantages=per_token, returns=per_token, action_mask=batch.action_mask)

    batch = RewardBatch.from_sequence_rewards(
        torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.ones(4, 3, dtype=torch.bool), group_size=2
    )
    result = compute_advantages("max_baseline", batch)  # --advantage_estimator max_baseline
    # result.advantages[:, 0] is [0.0, -1.0, 0.0, 0.0]

A second registration under a taken name raises ``ValueError``; looking up an unknown name raises
:class:`lrft.api.errors.ConfigError` listing the known ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, Protocol, TypeVar, overload

import attrs
from torch import Tensor

from lrft.algo.types import (
    AdvantageParams,
    Advantages,
    PolicyLossConfig,
    PolicyLossInputs,
    PolicyLossOutput,
    RewardBatch,
)
from lrft.api.errors import ConfigError

AdvantageEstimatorFn = Callable[[RewardBatch, AdvantageParams], Advantages]
"""Raw advantages and returns; never whitened (the normalisation stage does that)."""
PolicyLossFn = Callable[[PolicyLossInputs, PolicyLossConfig], PolicyLossOutput]
KLEstimatorFn = Callable[[Tensor, Tensor], Tensor]
"""Element-wise estimate from (logprobs, ref_logprobs); masking is done by the caller."""


def _summary(fn: Callable[..., object]) -> str:
    doc = (fn.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def _names(values: Iterable[str]) -> frozenset[str]:
    return frozenset(values)


@attrs.frozen(kw_only=True)
class AdvantageEstimatorSpec:
    """A registered advantage estimator.

    ``whiten``: whether :func:`lrft.algo.normalize_advantages` whitens its output over the batch
    (the single normalisation stage; the estimator itself never does). ``needs_values`` /
    ``needs_groups``: the estimator reads critic values / prompt group ids, checked before it runs.
    ``needs_teacher``: it reads the student's and a teacher's logprobs of the sampled tokens
    (on-policy distillation), so the trainer scores every sample with a teacher.
    ``reads``: the :class:`AdvantageParams` fields it uses, so that a trainer can refuse a flag
    (``--lambd`` with ``group_norm``, say) that would change nothing.
    """

    name: str
    fn: AdvantageEstimatorFn
    whiten: bool
    needs_values: bool = False
    needs_groups: bool = False
    needs_teacher: bool = False
    reads: frozenset[str] = attrs.field(default=frozenset(), converter=_names)

    def __attrs_post_init__(self) -> None:
        known = {field.name for field in attrs.fields(AdvantageParams)}
        unknown = sorted(self.reads - known)
        if unknown:
            raise ValueError(
                f"advantage estimator {self.name!r} reads unknown parameters {unknown}; "
                f"AdvantageParams has {sorted(known)}"
            )

    @property
    def description(self) -> str:
        return _summary(self.fn)


@attrs.frozen(kw_only=True)
class PolicyLossSpec:
    """A registered policy loss.

    ``sequence_level``: the loss is defined per response (GSPO, GMPO) and is the mean over
    responses by its definition, so ``PolicyLossConfig.aggregation`` does not apply to it; a
    trainer should reject an explicit aggregation for such a loss rather than ignore it.
    """

    name: str
    fn: PolicyLossFn
    sequence_level: bool = False

    @property
    def description(self) -> str:
        return _summary(self.fn)


@attrs.frozen(kw_only=True)
class KLEstimatorSpec:
    name: str
    fn: KLEstimatorFn

    @property
    def description(self) -> str:
        return _summary(self.fn)


class _Named(Protocol):
    @property
    def name(self) -> str: ...


SpecT = TypeVar("SpecT", bound=_Named)


class Registry(Generic[SpecT]):
    """Name -> spec, with errors that say what is known. ``kind`` names the registry in errors."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._specs: dict[str, SpecT] = {}

    def add(self, spec: SpecT) -> None:
        name = spec.name
        if not name or name != name.strip() or any(ch.isspace() for ch in name):
            raise ValueError(f"{self.kind} name must be non-empty without spaces, got {name!r}")
        if name in self._specs:
            raise ValueError(
                f"{self.kind} {name!r} is already registered ({self._specs[name]!r}); "
                f"pick another name or remove the existing one first"
            )
        self._specs[name] = spec

    def get(self, name: str) -> SpecT:
        try:
            return self._specs[name]
        except KeyError:
            known = ", ".join(repr(n) for n in self.names())
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def remove(self, name: str) -> SpecT:
        spec = self.get(name)
        del self._specs[name]
        return spec

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._specs))

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[SpecT]:
        return iter([self._specs[n] for n in self.names()])

    def __len__(self) -> int:
        return len(self._specs)


advantage_estimators: Registry[AdvantageEstimatorSpec] = Registry("advantage estimator")
policy_losses: Registry[PolicyLossSpec] = Registry("policy loss")
kl_estimators: Registry[KLEstimatorSpec] = Registry("KL estimator")

_A = TypeVar("_A", bound=AdvantageEstimatorFn)
_P = TypeVar("_P", bound=PolicyLossFn)
_K = TypeVar("_K", bound=KLEstimatorFn)


@overload
def register_advantage_estimator(
    name: str,
    *,
    whiten: bool,
    needs_values: bool = False,
    needs_groups: bool = False,
    needs_teacher: bool = False,
    reads: Iterable[str] = (),
) -> Callable[[_A], _A]: ...
@overload
def register_advantage_estimator(
    name: str,
    fn: _A,
    *,
    whiten: bool,
    needs_values: bool = False,
    needs_groups: bool = False,
    needs_teacher: bool = False,
    reads: Iterable[str] = (),
) -> _A: ...
def register_advantage_estimator(
    name: str,
    fn: _A | None = None,
    *,
    whiten: bool,
    needs_values: bool = False,
    needs_groups: bool = False,
    needs_teacher: bool = False,
    reads: Iterable[str] = (),
) -> _A | Callable[[_A], _A]:
    """Register an estimator under ``name``: call form with ``fn``, decorator form without.

    The keywords are :class:`AdvantageEstimatorSpec`'s fields.
    """
    read_params = frozenset(reads)

    def add(f: _A) -> _A:
        advantage_estimators.add(
            AdvantageEstimatorSpec(
                name=name,
                fn=f,
                whiten=whiten,
                needs_values=needs_values,
                needs_groups=needs_groups,
                needs_teacher=needs_teacher,
                reads=read_params,
            )
        )
        return f

    return add if fn is None else add(fn)


@overload
def register_policy_loss(name: str, *, sequence_level: bool = False) -> Callable[[_P], _P]: ...
@overload
def register_policy_loss(name: str, fn: _P, *, sequence_level: bool = False) -> _P: ...
def register_policy_loss(
    name: str, fn: _P | None = None, *, sequence_level: bool = False
) -> _P | Callable[[_P], _P]:
    """Register a policy loss under ``name``: call form with ``fn``, decorator form without."""

    def add(f: _P) -> _P:
        policy_losses.add(PolicyLossSpec(name=name, fn=f, sequence_level=sequence_level))
        return f

    return add if fn is None else add(fn)


@overload
def register_kl_estimator(name: str) -> Callable[[_K], _K]: ...
@overload
def register_kl_estimator(name: str, fn: _K) -> _K: ...
def register_kl_estimator(name: str, fn: _K | None = None) -> _K | Callable[[_K], _K]:
    """Register a KL estimator under ``name``: call form with ``fn``, decorator form without."""

    def add(f: _K) -> _K:
        kl_estimators.add(KLEstimatorSpec(name=name, fn=f))
        return f

    return add if fn is None else add(fn)
