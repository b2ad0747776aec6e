"""The prompts a run trains and evaluates on, as its settings say: the sources of
``prompt_data`` (comma-separated, mixed by ``prompt_data_probs``), their splits, the held-out
set, and the number of iterations they make (which the learning-rate schedule spans)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from lrft.config import TrainConfig
from lrft.data import DistributedPromptSampler, MediaProcessor, PromptDataConfig, PromptDataset
from lrft.data.mixture import load_prompt_mixture
from lrft.dist import RankInfo


def load_prompts(
    config: TrainConfig,
    paths: tuple[str, ...],
    tokenizer: PreTrainedTokenizerBase,
    *,
    limit: int | None,
    split: str | None,
    probs: tuple[float, ...] | None = None,
    processor: MediaProcessor | None = None,
) -> PromptDataset:
    """The prompts of ``paths`` formatted as ``config`` says (each source read up to ``limit``
    rows, from ``split``), mixed by ``probs`` when given (:mod:`lrft.data.mixture`)."""
    sources = [
        PromptDataConfig(
            prompt_data=path,
            input_key=config.input_key,
            label_key=config.label_key,
            reference_key=config.reference_key,
            apply_chat_template=config.apply_chat_template,
            system_prompt=config.system_prompt,
            input_template=config.input_template,
            max_prompt_length=config.prompt_max_len,
            max_samples=limit,
            split=split,
            # media (vision-language models)
            images_key=config.images_key,
            limit_mm_image_per_prompt=config.limit_mm_image_per_prompt,
            max_image_pixels=config.max_image_pixels,
            audios_key=config.audios_key,
            limit_mm_audio_per_prompt=config.limit_mm_audio_per_prompt,
        )
        for path in paths
    ]
    return load_prompt_mixture(
        sources, tokenizer, probs=probs, seed=config.seed, processor=processor
    )


def eval_prompts(
    config: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    processor: MediaProcessor | None = None,
) -> PromptDataset | None:
    """The held-out prompts: ``eval_dataset`` (its ``eval_split``), or with ``eval_split`` alone
    that split of ``prompt_data``."""
    if config.eval_dataset is not None:
        path = config.eval_dataset
    elif config.eval_split is not None:
        path = config.prompt_sources[0]
    else:
        return None
    return load_prompts(
        config,
        (path,),
        tokenizer,
        limit=config.eval_max_samples,
        split=config.eval_split,
        processor=processor,
    )


def planned_iterations(config: TrainConfig, prompts: int, info: RankInfo) -> int:
    """The run's iterations over ``prompts`` training prompts, as the trainer's sampler counts
    its batches."""
    sampler = DistributedPromptSampler(
        num_samples=prompts,
        global_batch_size=config.rollout_batch_size,
        rank=info.rank,
        world_size=info.world_size,
        seed=config.seed,
    )
    return config.planned_iterations(sampler.batches_per_epoch)
