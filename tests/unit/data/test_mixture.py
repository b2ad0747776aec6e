"""Several prompt sources as one training set: concatenated, or mixed by probabilities."""

from __future__ import annotations

from collections import Counter

import pytest

from lrft.api.errors import ConfigError
from lrft.data import PromptDataset, PromptSample, PromptStats
from lrft.data.mixture import mix_datasets, mixture_counts


def _dataset(name: str, size: int) -> PromptDataset:
    samples = tuple(
        PromptSample(prompt_text=f"{name}{i}", prompt_token_ids=[1 + i], source_index=i)
        for i in range(size)
    )
    stats = PromptStats(source=name, rows=size, kept=size, max_prompt_length=None)
    return PromptDataset(samples=samples, stats=stats)


def test_counts_are_the_shares_of_the_whole_by_largest_remainder() -> None:
    # 10 prompts at 0.25/0.35/0.4: 2.5, 3.5, 4 -> the first remainder wins the tie
    assert mixture_counts([4, 4, 2], [0.25, 0.35, 0.4]) == [3, 3, 4]
    assert mixture_counts([3, 7], [0.5, 0.5]) == [5, 5]
    assert sum(mixture_counts([5, 6, 7], [0.2, 0.3, 0.5])) == 18


def test_a_mixture_draws_each_share_without_replacement_then_cycles() -> None:
    small, large = _dataset("s", 3), _dataset("l", 9)
    mixed = mix_datasets([small, large], [0.5, 0.5], seed=7)
    texts = [sample.prompt_text for sample in mixed]
    by_source = Counter(text[0] for text in texts)
    assert by_source == {"s": 6, "l": 6}  # 12 prompts, half each
    small_drawn = [t for t in texts if t.startswith("s")]
    # twice through the small source, each pass a permutation of it
    assert sorted(small_drawn[:3]) == sorted(small_drawn[3:]) == ["s0", "s1", "s2"]
    large_drawn = [t for t in texts if t.startswith("l")]
    assert len(set(large_drawn)) == 6  # fewer than its size: no repeat
    assert mix_datasets([small, large], [0.5, 0.5], seed=7).samples == mixed.samples
    assert mix_datasets([small, large], [0.5, 0.5], seed=8).samples != mixed.samples
    assert (mixed.stats.source, mixed.stats.kept) == ("s+l mixed 0.5/0.5", 12)


def test_without_probabilities_the_sources_are_concatenated() -> None:
    one, two = _dataset("a", 2), _dataset("b", 3)
    assert mix_datasets([one], None, seed=0) is one
    joined = mix_datasets([one, two], None, seed=0)
    assert [s.prompt_text for s in joined] == ["a0", "a1", "b0", "b1", "b2"]


def test_a_mixture_needs_one_probability_per_source() -> None:
    with pytest.raises(ConfigError, match=r"1 probabilities for 2 prompt sources"):
        mix_datasets([_dataset("a", 2), _dataset("b", 2)], [1.0], seed=0)
