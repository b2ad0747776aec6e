"""lrft eval's metrics: the unbiased pass@k against its formula and against counting subsets,
mean@n, per-label breakdowns, and the settings' rules."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lrft.api.errors import ConfigError
from lrft.eval import (
    EvalSettings,
    PromptResult,
    by_label,
    pass_at_k,
    resolve_model,
    summarize,
    table,
)


@given(
    st.integers(1, 60).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_pass_at_k_is_chen_et_al_s_binomial_formula(case: tuple[int, int, int]) -> None:
    n, c, k = case
    expected = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 2, 2), (6, 1, 3), (7, 3, 4), (4, 0, 2), (4, 4, 1)])
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_correct_response(
    n: int, c: int, k: int
) -> None:
    responses = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(responses, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets))


def test_pass_at_k_stays_finite_where_binomials_overflow_floats() -> None:
    value = pass_at_k(2000, 3, 1000)
    assert 0.874 < value < 0.876  # 1 - (1/2)^3, nearly
    with pytest.raises(ValueError, match=r"0 <= c <= n and 1 <= k <= n"):
        pass_at_k(4, 5, 1)


RESULTS = [
    PromptResult(index=0, label="easy", greedy_score=1.0, sample_scores=(1.0, 1.0, 0.0, 1.0)),
    PromptResult(index=1, label="easy", greedy_score=0.0, sample_scores=(0.0, 1.0, 0.0, 0.0)),
    PromptResult(index=2, label="hard", greedy_score=0.0, sample_scores=(0.0, 0.0, 0.0, 0.0)),
]


def test_summaries_overall_and_by_label() -> None:
    overall = summarize(RESULTS, ks=(1, 2, 4), threshold=0.0)
    assert overall["prompts"] == 3
    assert overall["greedy/accuracy"] == pytest.approx(1 / 3)
    # per prompt c = 3, 1, 0 of n = 4
    assert overall["pass@1"] == pytest.approx((3 / 4 + 1 / 4 + 0) / 3)
    assert overall["pass@2"] == pytest.approx(
        (1 - 0 + (1 - 3 / 6) + 0) / 3
    )  # C(1,2)=0, C(3,2)/C(4,2)
    assert overall["pass@4"] == pytest.approx(2 / 3)
    assert overall["mean@4"] == pytest.approx((0.75 + 0.25 + 0.0) / 3)
    assert overall["reward_mean@4"] == pytest.approx(4 / 12)
    labels = by_label(RESULTS, ks=(1, 4), threshold=0.0)
    assert set(labels) == {"easy", "hard"}
    assert labels["easy"]["pass@4"] == 1.0
    assert labels["hard"]["pass@4"] == 0.0
    assert labels["easy"]["greedy/accuracy"] == 0.5
    # a stricter threshold counts fewer correct responses
    assert summarize(RESULTS, ks=(1,), threshold=1.0)["pass@1"] == 0.0
    text = table(overall, labels)
    assert text.splitlines()[0].split() == ["label", *overall]
    assert [line.split()[0] for line in text.splitlines()[1:]] == ["all", "easy", "hard"]


def test_greedy_only_results_report_greedy_metrics_only() -> None:
    greedy = [PromptResult(index=i, label="", greedy_score=float(i % 2)) for i in range(4)]
    assert summarize(greedy, ks=(1,), threshold=0.0) == {
        "prompts": 4.0,
        "greedy/accuracy": 0.5,
        "greedy/reward_mean": 0.5,
    }


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"greedy": False}, r"--no-greedy needs --n_samples N > 0"),
        ({"n_samples": 4, "ks": (1, 8)}, r"pass_k \[8\]: each k must be in \[1, n_samples 4\]"),
        ({"ks": (1, 2)}, r"pass_k needs --n_samples N"),
    ],
)
def test_settings_that_cannot_be_evaluated_are_refused(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        EvalSettings(model="m", dataset="d", **changes)  # type: ignore[arg-type]


def test_every_rule_the_settings_break_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as refused:
        EvalSettings(model="m", dataset="d", greedy=False, ks=(1, 2))
    assert refused.value.problems == (
        "nothing to evaluate: --no-greedy needs --n_samples N > 0",
        "pass_k needs --n_samples N (pass@k is over sampled responses)",
    )


def test_a_model_is_a_folder_or_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"neither a Hugging Face folder .* nor an lrft"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)).checkpoint is None
