"""The flags of ``lrft train``: one per :class:`~lrft.trainer.TrainConfig` field, same name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from lrft.algo import kl_estimators
from lrft.trainer.config import ENGINE_MAX_TP, TrainConfig, supported_estimators


@attrs.frozen(kw_only=True)
class Flag:
    name: str
    kind: Callable[[str], Any]
    help: str
    choices: Sequence[str] | None = None
    metavar: str | None = None


def _optional_int(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


FLAGS: tuple[Flag, ...] = (
    Flag(
        name="pretrain",
        kind=str,
        help="Hugging Face model folder to train (default: the built-in demo, which also brings its data and reward)",
    ),
    Flag(
        name="prompt_data",
        kind=str,
        help="training prompts: .jsonl/.json/.parquet file or datasets folder",
    ),
    Flag(
        name="eval_dataset",
        kind=str,
        help="held-out prompts, scored greedily at every --eval_steps and at the end",
    ),
    Flag(name="input_key", kind=str, help="column holding the prompt (default: input)"),
    Flag(name="label_key", kind=str, help="column passed to the reward as the sample's label"),
    Flag(
        name="reference_key", kind=str, help="column passed to the reward as the reference answer"
    ),
    Flag(
        name="apply_chat_template",
        kind=bool,
        help="format prompts with the tokenizer's chat template",
    ),
    Flag(name="input_template", kind=str, help="template with one {} for the prompt text"),
    Flag(
        name="prompt_max_len",
        kind=int,
        help="drop (and count) prompts with more tokens; never truncates",
    ),
    Flag(name="max_samples", kind=int, help="read only the first N training rows"),
    Flag(name="eval_max_samples", kind=int, help="read only the first N held-out rows"),
    Flag(
        name="reward_fn",
        kind=str,
        metavar="math|MODULE:FUNCTION",
        help="reward: 'math' (math-verify against --reference_key) or MODULE:FUNCTION scoring one RewardSample (or a RewardFn object)",
    ),
    Flag(name="n_samples_per_prompt", kind=int, help="responses sampled per prompt (a group)"),
    Flag(name="rollout_batch_size", kind=int, help="prompts per iteration, over all ranks"),
    Flag(
        name="micro_rollout_batch_size",
        kind=int,
        help="prompts per generate chunk and sequences per logprob forward (per rank)",
    ),
    Flag(name="generate_max_len", kind=int, help="maximum new tokens per response"),
    Flag(
        name="temperature",
        kind=float,
        help="sampling temperature (> 0) of training rollouts and of the policy's logprobs",
    ),
    Flag(name="top_p", kind=float, help="nucleus sampling threshold of training rollouts"),
    Flag(name="engine_type", kind=str, choices=tuple(ENGINE_MAX_TP), help="rollout engine"),
    Flag(
        name="engine_tp_size",
        kind=int,
        help="tensor-parallel size of the engine; the world size must divide by it (hf: 1)",
    ),
    Flag(
        name="enable_engine_sleep",
        kind=bool,
        help="sleep the engine outside rollouts and keep the reference model offloaded outside its pass",
    ),
    Flag(
        name="train_batch_size",
        kind=int,
        help="samples per optimizer step, over all ranks; must divide rollout_batch_size * n_samples_per_prompt",
    ),
    Flag(
        name="micro_train_batch_size",
        kind=int,
        help="samples per forward/backward per rank (gradient accumulation fills train_batch_size)",
    ),
    Flag(name="max_epochs", kind=int, help="policy epochs over each iteration's experience"),
    Flag(name="num_episodes", kind=int, help="passes over the training prompts"),
    Flag(
        name="max_steps",
        kind=_optional_int,
        help="stop after N iterations (default: num_episodes passes)",
    ),
    Flag(name="actor_learning_rate", kind=float, help="AdamW learning rate"),
    Flag(name="l2", kind=float, help="AdamW weight decay"),
    Flag(name="max_norm", kind=float, help="gradient-norm clip (0: off)"),
    Flag(
        name="advantage_estimator",
        kind=str,
        choices=supported_estimators(),
        help="advantage estimator (critic-based ones such as gae are not offered: this trainer has no critic)",
    ),
    Flag(name="eps_clip", kind=float, help="PPO ratio clip"),
    Flag(
        name="init_kl_coef",
        kind=float,
        help="KL coefficient against a frozen reference model (0: no reference model)",
    ),
    Flag(name="kl_estimator", kind=str, choices=kl_estimators.names(), help="KL estimator"),
    Flag(name="use_kl_loss", kind=bool, help="KL in the loss (GRPO) instead of in the reward"),
    Flag(
        name="normalize_reward",
        kind=bool,
        help="scale rewards by running statistics all-gathered across ranks (kept in checkpoints)",
    ),
    Flag(name="gradient_checkpointing", kind=bool, help="recompute activations in backward"),
    Flag(
        name="fsdp_cpu_offload",
        kind=bool,
        help="keep FSDP2 parameters, gradients and optimizer state on the host",
    ),
    Flag(
        name="zero_stage",
        kind=int,
        choices=None,
        help="train with DeepSpeed ZeRO stage 1, 2 or 3 instead of FSDP2 (pip install 'lrft[deepspeed]')",
    ),
    Flag(
        name="deepspeed_config",
        kind=str,
        help="DeepSpeed JSON merged into the config lrft generates (needs --zero_stage); conflicting keys are an error",
    ),
    Flag(
        name="adam_offload",
        kind=bool,
        help="keep optimizer state on the host outside the policy phase",
    ),
    Flag(name="seed", kind=int, help="seed of data order, rollouts and shuffling"),
    Flag(
        name="save_path",
        kind=str,
        help="output folder: metrics.jsonl, hf_model/, curves.png, tensorboard/",
    ),
    Flag(name="ckpt_path", kind=str, help="checkpoint folder (default: SAVE_PATH/checkpoints)"),
    Flag(name="save_steps", kind=int, help="checkpoint every N iterations (-1: never)"),
    Flag(name="max_ckpt_num", kind=int, help="checkpoints kept (oldest removed)"),
    Flag(
        name="load_checkpoint",
        kind=bool,
        help="resume from the latest complete checkpoint in ckpt_path",
    ),
    Flag(
        name="eval_steps", kind=int, help="evaluate every N iterations (-1: at start and end only)"
    ),
    Flag(
        name="save_hf_model",
        kind=bool,
        help="export the final weights to SAVE_PATH/hf_model (safetensors)",
    ),
    Flag(
        name="use_tensorboard",
        kind=bool,
        help="also write the metrics as TensorBoard scalars under SAVE_PATH/tensorboard "
        "(pip install 'lrft[plots]'; default: on for the built-in demo when tensorboard is installed)",
    ),
    Flag(
        name="collective_timeout_s",
        kind=float,
        help="seconds a rank waits on a collective before failing",
    ),
)

_fields = {field.name for field in attrs.fields(TrainConfig)}
assert {flag.name for flag in FLAGS} == _fields, sorted(_fields ^ {f.name for f in FLAGS})
