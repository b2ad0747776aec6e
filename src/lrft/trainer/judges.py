"""The generative reward models a :class:`TrainConfig` asks for (``grm_pretrain``): each judge is
a causal LM served by its own ``hf`` :class:`~lrft.api.RolloutEngine` on this rank, colocated with
the trainer like the reference and reward models.

With ``enable_engine_sleep`` a judge's engine sleeps at level 1 (KV cache freed, weights parked
on the host: waking restores them bit-exactly, so no weight sync is needed) from the moment it is
built, and :class:`ColocatedJudge` wakes it for its own call only; several judges and reward
models are thus resident one at a time during the reward phase. Each rank judges its own samples
(TP 1, nothing collective), and a judge's generate failing is a ``RewardError`` for the run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import attrs
import torch

from lrft.api.errors import ConfigError
from lrft.api.types import EnginePart
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.config import TrainConfig
from lrft.rewards.base import RewardOutput, RewardSample
from lrft.rewards.generative import GenerativeReward
from lrft.rewards.judge_template import load_judge_template

JUDGE_SLEEP_LEVEL = 1
"""A judge's weights never change: level 1 parks them, and waking needs no weight sync."""


@attrs.frozen(kw_only=True, eq=False)
class ColocatedJudge:
    """A judge's reward whose engine is awake only during the call (``sleep_level`` set)."""

    reward: GenerativeReward
    sleep_level: int | None

    @property
    def name(self) -> str:
        return self.reward.name

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        engine = self.reward.engine
        if self.sleep_level is not None:
            # weights before the KV cache, as for the policy's engine
            engine.wake([EnginePart.WEIGHTS])
            engine.wake([EnginePart.KV_CACHE])
        try:
            return self.reward(samples)
        finally:
            if self.sleep_level is not None:
                engine.sleep(self.sleep_level)


def check_judge_folder(path: str) -> None:
    """``path`` is a model folder whose architecture generates (not a scalar reward model)."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"grm_pretrain {path!r} is not a model folder (no config.json)")
    architectures = json.loads(config_file.read_text(encoding="utf-8")).get("architectures") or []
    scalar = [a for a in architectures if str(a).endswith("ForSequenceClassification")]
    if scalar:
        raise ConfigError(
            f"grm_pretrain {path!r} is a {scalar[0]}, a scalar reward model: give it to "
            "--reward_pretrain; a judge is a causal LM that writes its verdict"
        )


def load_judge(
    path: str, *, name: str, config: TrainConfig, device: torch.device
) -> ColocatedJudge:
    """The judge in folder ``path`` on its own engine, asleep when ``enable_engine_sleep``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"grm_pretrain {path!r}: the tokenizer has no end-of-sequence token")
    if config.grm_apply_chat_template and not tokenizer.chat_template:
        raise ConfigError(
            f"grm_apply_chat_template, but the tokenizer of grm_pretrain {path!r} has no "
            "chat_template"
        )
    engine = HFRolloutEngine.from_pretrained(
        path,
        config=HFEngineConfig(
            # the dtype the policy's engine runs in: bf16 on CUDA, fp32 on the CPU
            dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
            device=device,
            max_batch_size=config.micro_rollout_batch_size * config.n_samples_per_prompt,
            decode=config.hf_decode,
        ),
    )
    reward = GenerativeReward(
        engine=engine,
        tokenizer=tokenizer,
        template=load_judge_template(config.grm_template),
        max_new_tokens=config.grm_max_new_tokens,
        stop_token_ids=(int(tokenizer.eos_token_id),),
        apply_chat_template=config.grm_apply_chat_template,
        unparsable_score=config.grm_unparsable_score,
        name=name,
    )
    level = JUDGE_SLEEP_LEVEL if config.enable_engine_sleep else None
    if level is not None:
        engine.sleep(level)
    return ColocatedJudge(reward=reward, sleep_level=level)
