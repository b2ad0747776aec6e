"""LightRFT's command lines under ``lrft train``: what lrft reads with LightRFT's meaning, and a
migration hint for every other flag of LightRFT's documented examples.

:func:`translate` runs before argparse. A LightRFT switch with an lrft equivalent (:data:`ALIASES`:
``--fsdp``, ``--flash_attn``, ``--disable_engine_sleep``) becomes that lrft setting; a LightRFT
flag that lrft reads otherwise or not at all (:data:`HINTS`) fails the command with one line
naming the lrft flag to use instead. A value given to a switch (``--use_wandb KEY``: LightRFT's
W&B flag takes the API key) is refused without being shown, and so are the values of unknown
flags: a message never repeats what followed a flag it did not understand. The table in
``docs/lightrft-migration.md`` is these two mappings.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import attrs

from lrft.api.errors import ConfigError
from lrft.cli.launch import did_you_mean
from lrft.config.problems import active as active_problems


@attrs.frozen(kw_only=True)
class Alias:
    """A LightRFT switch that means one lrft setting: ``flag`` becomes ``argv``."""

    argv: tuple[str, ...]
    meaning: str


ALIASES: dict[str, Alias] = {
    "fsdp": Alias(
        argv=("--train_backend=fsdp2",),
        meaning="train with FSDP2 (lrft's default); with --zero_stage it is an error, not "
        "a silent pick",
    ),
    "flash_attn": Alias(
        argv=("--attn_implementation=flash_attention_2",),
        meaning="the trained models' attention in flash_attention_2 (needs flash-attn and CUDA)",
    ),
    "disable_engine_sleep": Alias(
        argv=("--no-enable_engine_sleep",),
        meaning="keep the engine awake between rollouts (lrft's default)",
    ),
}
"""LightRFT's switches that lrft reads with the same meaning, and the lrft flags they become."""

HINTS: dict[str, str] = {
    # precision, kernels and memory: lrft decides, or has its own flag
    "bf16": "lrft computes in bf16 with fp32 master weights on CUDA, and in fp32 on the CPU, by "
    "itself: drop the flag",
    "use_mp_opt": "lrft's FSDP2 keeps fp32 parameters and optimizer state and computes in bf16 "
    "on CUDA: drop the flag",
    "fused_linear_logprob": "lrft computes logprobs without full-vocabulary logits by itself "
    "(unless the entropy is needed): drop the flag",
    "chunk_size": "lrft sizes its fused logprob chunks itself: drop the flag",
    "meta_init": "lrft loads each model once per rank and shards it as it wraps it: drop the flag",
    "actor_init_on_gpu": "the train backend places the actor on each rank's device: drop the flag",
    "sp_size": "lrft's --sequence_parallel_size N (with --packing_samples)",
    "zpg": "lrft has no ZeRO++ partitioning; --deepspeed_config FILE passes DeepSpeed's own keys",
    "overlap_comm": "pass DeepSpeed's overlap_comm through --deepspeed_config FILE",
    "grad_accum_dtype": "pass DeepSpeed's data types through --deepspeed_config FILE",
    "gradient_checkpointing_use_reentrant": "lrft's --gradient_checkpointing uses transformers' "
    "default: drop the flag",
    "disable_logprobs_flashattn": "choose the trained models' kernel with --attn_implementation",
    "local_rank": "lrft reads its rank from torchrun's LOCAL_RANK: drop the flag",
    # the rollout engine and reward models
    "rm_use_engine": "lrft serves judges (--grm_pretrain) on their own hf engines and scores "
    "with scalar reward models (--reward_pretrain) by a forward pass: drop the flag",
    "rm_engine_cudagraph": "lrft's hf engine decodes with CUDA graphs by itself on CUDA "
    "(--hf_decode): drop the flag",
    "text_only": "lrft reads what a model is from its folder: drop the flag",
    "mixed_mm_data": "lrft batches prompts with and without images together: drop the flag",
    "freeze_prefix": "lrft's --freeze_vision_tower freezes a vision-language model's tower",
    "no_shard_vit": "drop the flag",
    # algorithm switches that lrft spells as a choice
    "use_gspo": "lrft's --policy_loss_type gspo",
    "use_cpg_loss": "lrft's --policy_loss_type cpgd",
    "overlong_buffer": "lrft's --overlong_buffer_len N turns overlong shaping on",
    "overlong_buffer_penalty_factor": "lrft's --overlong_penalty_factor",
    "clip_range": "lrft's --eps_clip",
    "clip_range_higher": "lrft's --eps_clip_low_high LOW HIGH",
    "reward_running_norm": "lrft's --normalize_reward subtracts the running mean and divides by "
    "the running std (LightRFT's --reward_running_norm --reward_running_norm_minus_mean); "
    "dividing by the std alone has no lrft flag",
    "reward_running_norm_minus_mean": "lrft's --normalize_reward",
    "advantages_norm": "lrft's advantage estimators whiten their advantages where they are "
    "defined to (group_norm, reinforce++, gae): choose --advantage_estimator",
    "normalize_advantages": "lrft's advantage estimators normalise as they are defined to: "
    "choose --advantage_estimator",
    "use_sequence_rewards": "lrft's rewards are per response: drop the flag",
    "normalize_reward_for_critic": "lrft's --normalize_reward normalises the rewards the critic "
    "learns from",
    "value_head_prefix": "lrft's critic keeps its value head under transformers' "
    "token-classification name: drop the flag",
    "ptx_coef": "lrft has no pretraining loss during RL",
    "pretrain_data": "lrft has no pretraining loss during RL",
    "pretrain_data_probs": "lrft has no pretraining loss during RL",
    "pretrain_split": "lrft has no pretraining loss during RL",
    "aux_loss_coef": "lrft adds no MoE balancing loss",
    "enable_ema": "lrft exports the trained weights themselves; it keeps no EMA copy",
    "freezing_actor_steps": "lrft trains the actor and the critic together from the first step",
    "save_value_network": "lrft saves the critic in every checkpoint",
    # data
    "eval_data": "lrft's --eval_dataset",
    "max_eval_samples": "lrft's --eval_max_samples",
    "max_len": "lrft bounds prompts with --prompt_max_len and responses with --generate_max_len",
    "disable_fast_tokenizer": "lrft uses the tokenizer the model folder holds: drop the flag",
    "use_ms": "lrft reads local folders only: drop the flag",
    "processor": "lrft reads the processor the model folder holds: drop the flag",
    # checkpoints and logging
    "save_interval": "lrft checkpoints every --save_steps N iterations",
    "save_hf_ckpt": "lrft exports SAVE_PATH/hf_model at the end (--save_hf_model, on by default)",
    "disable_ds_ckpt": "lrft's checkpoints are what a resume needs: drop the flag",
    "max_ckpt_mem": "lrft bounds checkpoints by number: --max_ckpt_num",
    "logging_steps": "lrft logs every iteration to SAVE_PATH/metrics.jsonl: drop the flag",
    "log_dir": "lrft writes its metrics and curves under --save_path",
    "plot_every": "lrft plots SAVE_PATH/curves.png at the end of a run: drop the flag",
    "num_trajectories_to_save": "lrft's --save_trajectories writes every sample, "
    "--save_trajectories_steps N every N iterations",
    "mark_high_entropy_tokens": "drop the flag (lrft's trajectories hold each sample's texts)",
    "trajectory_analysis": "drop the flag",
    "print_replay_buffer_stats": "drop the flag",
}
"""LightRFT flags that lrft does not read as LightRFT does: the one-line hint each gets."""

SWITCH_HINTS: dict[str, str] = {
    "use_wandb": "lrft reads the W&B API key from WANDB_API_KEY or `wandb login`, the project "
    "from --wandb_project",
    "use_tensorboard": "lrft writes TensorBoard logs under SAVE_PATH/tensorboard",
}
"""What a value given to one of these lrft switches most likely meant (a LightRFT habit)."""

_NOT_SHOWN = "(the value is not shown: it may be a secret)"


def _name(token: str) -> str | None:
    """The flag name of a ``--name`` or ``--name=value`` token; ``None`` for other tokens."""
    if not token.startswith("--") or token == "--":
        return None
    return token[2:].split("=", 1)[0]


def _is_value(token: str) -> bool:
    return not token.startswith("-") or token.lstrip("-")[:1].isdigit()


def translate(
    argv: Sequence[str],
    *,
    switches: Collection[str],
    valued: Collection[str],
    known_engines: Collection[str],
) -> list[str]:
    """``argv`` with LightRFT's switches in their lrft spelling (:data:`ALIASES`).

    ``switches`` and ``valued`` name lrft's own flags (switches also take ``--no-NAME``);
    ``known_engines`` the registered rollout engines. Raises ``ConfigError`` naming every
    LightRFT flag lrft reads otherwise (with its hint), every value given to a switch (never
    shown), and every unknown flag (its value never shown); inside
    :func:`lrft.config.problems.gathering` it reports them there and returns the other flags.
    """
    out: list[str] = []
    problems: list[str] = []
    unknown: list[str] = []
    tokens = list(argv)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        name = _name(token)
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        index += 1
        if name is None:
            out.append(token)
            continue
        is_switch = name in switches or name in ALIASES or _negated(name, switches)
        if is_switch and ("=" in token or (following is not None and _is_value(following))):
            if "=" not in token:
                index += 1  # the value, dropped unseen
            hint = SWITCH_HINTS.get(name, "give the switch alone, or --no-" + name)
            problems.append(f"--{name} is a switch and takes no value {_NOT_SHOWN}: {hint}")
            # the switch is kept, so that the rest is checked as it will run once fixed
            out.extend(ALIASES[name].argv if name in ALIASES else [f"--{name}"])
            continue
        if name in ALIASES:
            out.extend(ALIASES[name].argv)
            continue
        if name in HINTS and name not in valued and name not in switches:
            problems.append(f"--{name}: {HINTS[name]}")
            index += _skip_value(token, following)
            continue
        if name in valued or is_switch or name in ("config", "help"):
            value_hint = _value_hint(name, token, following, known_engines)
            if value_hint is not None:
                # left out with its value: no later check reads (or shows) a value refused here
                problems.append(value_hint)
                index += _skip_value(token, following)
                continue
            out.append(token)
            continue
        unknown.append(f"--{name}")
        index += _skip_value(token, following)
    if unknown:
        flags = [f"--{name}" for name in (*valued, *switches)]
        named = [
            flag if not (hint := did_you_mean(flag, flags)) else f"{flag} ({hint})"
            for flag in unknown
        ]
        problems.append(
            f"unknown flag{'s' if len(unknown) > 1 else ''} {', '.join(named)} (values not "
            "shown; `lrft train --help` lists every flag)"
        )
    if problems:
        error = ConfigError(*problems)
        gatherer = active_problems()
        if gatherer is None:
            raise error
        gatherer.add(error)  # the flags left out, the rest is checked too
    return out


def _negated(name: str, switches: Collection[str]) -> bool:
    return name.startswith("no-") and name[3:] in switches


def _skip_value(token: str, following: str | None) -> int:
    """1 when the token's value is the next token (dropped unseen), else 0."""
    return int("=" not in token and following is not None and _is_value(following))


def _value_hint(
    name: str, token: str, following: str | None, known_engines: Collection[str]
) -> str | None:
    """A hint for a LightRFT value of an lrft flag that lrft reads otherwise."""
    value = token.split("=", 1)[1] if "=" in token else following
    if value is None:
        return None
    if name == "engine_type" and value == "sglang" and "sglang" not in known_engines:
        return (
            "--engine_type sglang: lrft has no SGLang engine yet (planned); use --engine_type "
            "vllm (pip install 'lrft[vllm]') or hf, or install a package that registers one"
        )
    if name == "reward_pretrain" and value.lstrip().startswith("{"):
        return (
            "--reward_pretrain: lrft takes comma-separated reward-model folders, not LightRFT's "
            "JSON (value not shown); per-label recipes go in --reward_recipes FILE, and no "
            "reward model is no --reward_pretrain at all"
        )
    return None
