"""Reducing a (B, T) matrix of token losses to the scalar that is back-propagated.

The modes differ in how much weight a long response gets, which is the point of Dr. GRPO
(Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"): averaging over
each response's own length biases towards short correct and long wrong answers.

With ``L`` the token losses, ``m`` the mask, ``S`` the rows with at least one valid token:

- ``token-mean``:              sum_i sum_t L m / sum_i sum_t m (every valid token counts once)
- ``seq-mean-token-mean``:     1/|S| sum_{i in S} (sum_t L m / sum_t m)
- ``seq-mean-token-sum``:      1/|S| sum_{i in S} sum_t L m
- ``seq-mean-token-sum-norm``: 1/|S| sum_{i in S} (sum_t L m) / max_len, max_len a constant

Rows without a valid token take no part, so appending a fully padded row changes nothing. An
all-padding batch gives 0 (not NaN), keeping the graph connected for collective backward passes.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from lrft.algo._tensor import (
    as_mask,
    check_2d,
    check_same_shape,
    masked_mean,
    masked_sum,
    mean_over_rows,
    nonempty_rows,
    sequence_mean,
)
from lrft.algo.types import AGGREGATION_MODES, AggregationMode
from lrft.api.errors import ConfigError


def _token_mean(losses: Tensor, mask: Tensor, max_len: int | None) -> Tensor:
    return masked_mean(losses, mask)


def _seq_mean_token_mean(losses: Tensor, mask: Tensor, max_len: int | None) -> Tensor:
    return mean_over_rows(sequence_mean(losses, mask), nonempty_rows(mask))


def _seq_mean_token_sum(losses: Tensor, mask: Tensor, max_len: int | None) -> Tensor:
    return mean_over_rows(masked_sum(losses, mask, dim=-1), nonempty_rows(mask))


def _seq_mean_token_sum_norm(losses: Tensor, mask: Tensor, max_len: int | None) -> Tensor:
    if max_len is None or max_len < 1:
        raise ConfigError(
            f"aggregation 'seq-mean-token-sum-norm' needs a positive constant max_len, "
            f"got {max_len!r}"
        )
    return _seq_mean_token_sum(losses, mask, None) / max_len


_AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, int | None], Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}
assert tuple(_AGGREGATIONS) == AGGREGATION_MODES


def aggregate_loss(
    token_losses: Tensor,
    action_mask: Tensor,
    mode: AggregationMode,
    *,
    max_len: int | None = None,
) -> Tensor:
    """Reduce ``token_losses`` (B, T) over the valid tokens of ``action_mask`` (B, T) by ``mode``.

    The formulas are in the module docstring; ``max_len`` is required by (and only read by)
    ``seq-mean-token-sum-norm``, whose point is a divisor that does not depend on the batch.
    """
    reduce = _AGGREGATIONS.get(mode)
    if reduce is None:
        known = ", ".join(repr(m) for m in AGGREGATION_MODES)
        raise ConfigError(f"unknown aggregation mode {mode!r}; known: {known}")
    mask = as_mask(action_mask)
    check_2d("token_losses", token_losses)
    check_same_shape("token_losses", token_losses, action_mask=mask)
    return reduce(token_losses, mask, max_len)


def aggregation_divisor(action_mask: Tensor, mode: AggregationMode) -> Tensor:
    """The count ``mode`` divides by: valid tokens (``token-mean``) or rows with a valid token
    (the ``seq-mean-*`` modes; ``seq-mean-token-sum-norm``'s ``max_len`` is a constant).

    Every mode is a sum of per-row terms over this count, so for rows ``S`` of a batch ``G``,
    ``aggregate_loss(L[S]) * divisor(S) / divisor(G)`` summed over a partition of ``G`` equals
    ``aggregate_loss(L[G])``: a batch can be computed in parts with its loss unchanged.
    """
    if mode not in _AGGREGATIONS:
        known = ", ".join(repr(m) for m in AGGREGATION_MODES)
        raise ConfigError(f"unknown aggregation mode {mode!r}; known: {known}")
    mask = as_mask(action_mask)
    if mode == "token-mean":
        return mask.sum()
    return nonempty_rows(mask).sum()
