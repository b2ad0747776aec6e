"""What generates and scores, as ``lrft train`` and ``lrft eval`` both build it: the engine, its
TP group and the experience maker around them, the reward and the sampling settings."""

from __future__ import annotations

import attrs
import torch
from torch.distributed import ProcessGroup
from transformers import PreTrainedTokenizerBase

from lrft.api.protocols import RolloutEngine
from lrft.api.types import SamplingParams
from lrft.config import TrainConfig
from lrft.dist import RankInfo, RolloutLayout
from lrft.rewards import RewardFn
from lrft.trainer.components import rollout_engine
from lrft.trainer.experience import Decode, ExperienceMaker


def rollout_sampling(config: TrainConfig, eos_token_id: int | None) -> SamplingParams:
    """How training rollouts sample; the engine returns its own logprobs when TIS reads them."""
    return SamplingParams(
        n=config.n_samples_per_prompt,
        temperature=config.temperature,
        top_p=config.top_p,
        max_new_tokens=config.generate_max_len,
        stop_token_ids=() if eos_token_id is None else (int(eos_token_id),),
        return_logprobs=config.use_tis,
    )


def decoder(tokenizer: PreTrainedTokenizerBase) -> Decode:
    """Response tokens to text, as the rewards and the records read them."""
    return lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=True))


def experience_maker(
    config: TrainConfig,
    *,
    engine: RolloutEngine | None,
    decode: Decode,
    reward: RewardFn | None,
    device: torch.device,
    tp_group: ProcessGroup | None,
    eos_token_id: int | None,
) -> ExperienceMaker:
    """The experience maker that ``config`` describes, around already-built components."""
    return ExperienceMaker(
        engine=engine,
        decode=decode,
        reward=reward,
        sampling=rollout_sampling(config, eos_token_id),
        estimator=config.advantage_estimator,
        micro_batch_size=config.micro_rollout_batch_size,
        device=device,
        tp_group=tp_group,
        kl_coef=config.init_kl_coef,
        kl_estimator=config.kl_estimator,
        kl_in_reward=not config.use_kl_loss,
        normalize_reward=config.normalize_reward,
        advantage_params=config.advantage_params,
        first_token_temperature=config.first_token_temperature,
        overlong_buffer_len=config.overlong_buffer_len,
        overlong_penalty_factor=config.overlong_factor,
        reward_clip=config.reward_clip,
        advantage_clip=config.advantage_clip,
    )


@attrs.frozen(kw_only=True, eq=False)
class RolloutStack:
    """What generates and scores: the engine serving the policy on this rank, its TP group
    (``None`` at TP 1), and the experience maker around them and the reward (if any)."""

    engine: RolloutEngine
    tp_group: ProcessGroup | None
    maker: ExperienceMaker


def rollout_stack(
    config: TrainConfig,
    info: RankInfo,
    *,
    pretrain: str,
    reward: RewardFn | None,
    tokenizer: PreTrainedTokenizerBase,
    device: torch.device,
    samples_per_prompt: int | None = None,
) -> RolloutStack:
    """The engine serving ``pretrain``, its TP group and the experience maker, as ``lrft
    train`` and ``lrft eval`` both build them; the engine's batches hold
    ``micro_rollout_batch_size`` prompts of ``samples_per_prompt`` responses (default:
    ``n_samples_per_prompt``). ``reward``: ``None`` for a run that scores no sample
    (``no_task_reward`` without a reward). Collective over the default group."""
    engine = rollout_engine(pretrain, config, info, samples_per_prompt=samples_per_prompt)
    tp_group = None
    if config.engine_tp_size > 1:
        layout = RolloutLayout(world_size=info.world_size, tp_size=config.engine_tp_size)
        tp_group = layout.build_groups().tp_group
    maker = experience_maker(
        config,
        engine=engine,
        decode=decoder(tokenizer),
        reward=reward,
        device=device,
        tp_group=tp_group,
        eos_token_id=tokenizer.eos_token_id,
    )
    return RolloutStack(engine=engine, tp_group=tp_group, maker=maker)
