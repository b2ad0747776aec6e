"""Several prompt sources as one training set: concatenated, or mixed by probabilities.

LightRFT's ``--prompt_data a,b --prompt_data_probs 0.3,0.7``: the mixed set holds as many prompts
as the sources together (``M``); source ``i`` contributes ``p_i * M`` of them (rounded by largest
remainder, so the counts sum to ``M``), drawn without replacement in a seeded order and cycled
(each cycle in a new order) when it has fewer prompts than its share. Without probabilities the
sources are concatenated as they are. The sampler shuffles the set; its order here is the
sources' order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import torch

from lrft.api.errors import ConfigError
from lrft.data.dataset import PromptDataConfig, PromptDataset, load_prompt_dataset
from lrft.data.processor import MediaProcessor
from lrft.data.types import PromptSample, PromptStats

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def mixture_counts(sizes: Sequence[int], probs: Sequence[float]) -> list[int]:
    """How many prompts each source gives a mixture of ``sum(sizes)`` prompts: ``probs``
    apportioned by largest remainder (ties to the earlier source)."""
    if len(sizes) != len(probs):
        raise ConfigError(f"{len(probs)} probabilities for {len(sizes)} prompt sources")
    total = sum(sizes)
    exact = [p * total for p in probs]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _draw(size: int, count: int, generator: torch.Generator) -> list[int]:
    """``count`` indices of ``range(size)``: whole seeded permutations, cycled."""
    drawn: list[int] = []
    while len(drawn) < count:
        drawn.extend(int(i) for i in torch.randperm(size, generator=generator))
    return drawn[:count]


def mix_datasets(
    datasets: Sequence[PromptDataset], probs: Sequence[float] | None, *, seed: int
) -> PromptDataset:
    """The datasets concatenated (``probs`` ``None``) or mixed by ``probs`` (see the module
    docstring); one dataset without probabilities is returned as it is."""
    if not datasets:
        raise ConfigError("a prompt mixture needs at least one source")
    if probs is None and len(datasets) == 1:
        return datasets[0]
    sizes = [len(d) for d in datasets]
    counts = sizes if probs is None else mixture_counts(sizes, probs)
    generator = torch.Generator().manual_seed(seed)
    samples: list[PromptSample] = []
    for dataset, count in zip(datasets, counts, strict=True):
        if probs is None:
            samples.extend(dataset.samples)
        else:
            samples.extend(dataset.samples[i] for i in _draw(len(dataset), count, generator))
    names = "+".join(d.stats.source for d in datasets)
    shares = "" if probs is None else f" mixed {'/'.join(f'{p:g}' for p in probs)}"
    stats = PromptStats(
        source=f"{names}{shares}",
        rows=len(samples),
        kept=len(samples),
        max_prompt_length=datasets[0].stats.max_prompt_length,
        longest_kept=max(sample.prompt_length for sample in samples),
    )
    loaders = [d.media for d in datasets if d.media is not None]
    # One model, one processor: the sources' loaders differ only in the name their errors give.
    media = None if not loaders else attrs.evolve(loaders[0], source=names)
    return PromptDataset(samples=tuple(samples), stats=stats, media=media)


def load_prompt_mixture(
    configs: Sequence[PromptDataConfig],
    tokenizer: PreTrainedTokenizerBase,
    *,
    probs: Sequence[float] | None = None,
    seed: int = 0,
    processor: MediaProcessor | None = None,
) -> PromptDataset:
    """Each config's prompts (:func:`~lrft.data.load_prompt_dataset`, media expanded by
    ``processor``), then :func:`mix_datasets`."""
    datasets = [load_prompt_dataset(c, tokenizer, processor) for c in configs]
    return mix_datasets(datasets, probs, seed=seed)
