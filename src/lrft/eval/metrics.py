"""Evaluation metrics from per-prompt results: greedy accuracy, pass@k, mean@n, by label.

A response is *correct* when its reward exceeds a threshold (``correct_above``, 0 by default:
the trainer's ``eval/accuracy`` counts the same). With ``n`` samples per prompt and ``c`` of them
correct:

- ``pass@k`` is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
  Trained on Code", eq. 1): ``1 - C(n - c, k) / C(n, k)``, the chance that at least one of ``k``
  responses drawn without replacement from the ``n`` is correct, averaged over prompts;
- ``mean@n`` is ``c / n`` averaged over prompts (the expected accuracy of one sampled response);
- ``reward_mean@n`` is the mean reward of every sampled response.

``greedy/accuracy`` and ``greedy/reward_mean`` score one greedy response per prompt.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import attrs


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with ``c`` correct responses out of ``n``.

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, which equals ``1 - C(n-c, k) / C(n, k)``
    without forming the binomials (they overflow floats at n in the thousands).
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@attrs.frozen(kw_only=True)
class PromptResult:
    """One prompt's evaluation: its source row, label, greedy reward, and sampled rewards, with
    the prompt as the model saw it and the responses scored."""

    index: int
    label: str
    greedy_score: float | None
    sample_scores: tuple[float, ...] = ()
    prompt: str = ""
    greedy_response: str | None = None
    sample_responses: tuple[str, ...] = ()

    def correct(self, threshold: float) -> int:
        return sum(score > threshold for score in self.sample_scores)

    def as_json(self, threshold: float) -> dict[str, object]:
        return {
            "index": self.index,
            "label": self.label,
            "greedy_score": self.greedy_score,
            "greedy_correct": None
            if self.greedy_score is None
            else bool(self.greedy_score > threshold),
            "samples": len(self.sample_scores),
            "correct": self.correct(threshold),
            "sample_scores": list(self.sample_scores),
            "prompt": self.prompt,
            "greedy_response": self.greedy_response,
            "sample_responses": list(self.sample_responses),
        }


def summarize(
    results: Sequence[PromptResult], *, ks: Iterable[int], threshold: float
) -> dict[str, float]:
    """The metrics of the module docstring over ``results`` (each sampled ``n`` times, the same
    ``n`` for all, or not sampled); ``ks`` above ``n`` are left out."""
    metrics: dict[str, float] = {"prompts": float(len(results))}
    greedy = [r.greedy_score for r in results if r.greedy_score is not None]
    if greedy:
        metrics["greedy/accuracy"] = sum(s > threshold for s in greedy) / len(greedy)
        metrics["greedy/reward_mean"] = sum(greedy) / len(greedy)
    sizes = {len(r.sample_scores) for r in results}
    if len(sizes) > 1:
        raise ValueError(f"every prompt must be sampled equally often, got sizes {sorted(sizes)}")
    n = sizes.pop() if sizes else 0
    if n == 0 or not results:
        return metrics
    for k in sorted(set(ks)):
        if k <= n:
            values = [pass_at_k(n, r.correct(threshold), k) for r in results]
            metrics[f"pass@{k}"] = sum(values) / len(values)
    metrics[f"mean@{n}"] = sum(r.correct(threshold) / n for r in results) / len(results)
    every = [score for r in results for score in r.sample_scores]
    metrics[f"reward_mean@{n}"] = sum(every) / len(every)
    return metrics


def by_label(
    results: Sequence[PromptResult], *, ks: Iterable[int], threshold: float
) -> dict[str, dict[str, float]]:
    """:func:`summarize` of each label's prompts, by label."""
    labels = sorted({r.label for r in results})
    keep = tuple(ks)
    return {
        label: summarize([r for r in results if r.label == label], ks=keep, threshold=threshold)
        for label in labels
    }


def table(overall: Mapping[str, float], per_label: Mapping[str, Mapping[str, float]]) -> str:
    """A plain-text table: one row per label (and ``all``), one column per metric."""
    columns = list(overall)
    rows = [("all", overall), *per_label.items()]
    cells = [["label", *columns]]
    for name, values in rows:
        cells.append([name, *(_cell(values.get(column)) for column in columns)])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join(
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in cells
    )


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() and value >= 1 else f"{value:.4f}"
