"""The rules of :class:`lrft.config.TrainConfig` that span several fields.

``TrainConfig`` runs them all at construction and reports every problem they find together
(:mod:`lrft.config.problems`); :func:`validate_world` runs once the number of ranks is known. Each error names the values and the rule. They read the fields only
(:class:`lrft.config.fields.TrainFields`); the one rule on a derived value, the policy
loss's, is given that value.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable

import attrs
import torch

from lrft.algo import PolicyLossConfig, PolicyLossInputs, advantage_estimators, policy_losses
from lrft.api.errors import ConfigError
from lrft.backends import registry
from lrft.config import long_sequences
from lrft.config.fields import TrainFields
from lrft.config.split_checks import validate_split_world
from lrft.redaction import redact
from lrft.rewards.retry import retry_backoff_s

CRITIC_SETTINGS = ("critic_pretrain", "critic_learning_rate", "value_clip")
"""The fields that configure the critic, which only value-based estimators (gae) train."""
ALGORITHM_SETTINGS = (
    ("tis_cap", "use_tis"),
    ("overlong_penalty_factor", "overlong_buffer_len"),
    ("fire_first_token_temperature", "use_fire_sampling"),
    ("max_num_gen_batches", "dynamic_sampling"),
)
"""(setting, the switch it needs): each setting is read only when its switch is on."""
WANDB_SETTINGS = ("wandb_project", "wandb_org", "wandb_group", "wandb_run_name")
"""The fields that say where the W&B run goes; each needs ``use_wandb``."""


def supported_estimators() -> tuple[str, ...]:
    """Every registered advantage estimator; value-based ones (``needs_values``) get a critic."""
    return advantage_estimators.names()


def value_based_estimators() -> tuple[str, ...]:
    """The registered estimators that read critic values: with them the trainer trains a critic."""
    return tuple(s.name for s in advantage_estimators if s.needs_values)


def _default(config: TrainFields, name: str) -> object:
    return attrs.fields_dict(type(config))[name].default


def check_run_settings(config: TrainFields) -> None:
    """Token selection against repacking, ``top_p``, ``max_steps``, and the data a model needs."""
    if config.max_tokens_per_micro_batch is not None and config.high_entropy_token_ratio > 0:
        raise ConfigError(
            f"high_entropy_token_ratio {config.high_entropy_token_ratio} selects tokens within "
            "each micro-batch, which max_tokens_per_micro_batch repacks: set one of them"
        )
    if not 0.0 < config.top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {config.top_p!r}")
    if config.max_steps is not None and config.max_steps < 1:
        raise ConfigError(
            f"max_steps must be a positive integer or unset, got {config.max_steps!r}"
        )
    if config.load_checkpoint and config.overwrite_output:
        raise ConfigError(
            "load_checkpoint continues the run in save_path, overwrite_output replaces it with "
            "a new one: choose one"
        )
    if config.pretrain is not None and config.prompt_data is None and config.preset is None:
        raise ConfigError(
            "pretrain needs prompt_data (only the built-in demo and presets bring their own)"
        )


def check_reward_settings(config: TrainFields) -> None:
    """A model brings a reward, the demo none; each reward setting has the reward it sizes."""
    rewarded = config.reward_count > 0 or config.no_task_reward
    if config.pretrain is not None and config.preset is None and not rewarded:
        raise ConfigError(
            "pretrain needs a reward: reward_fn (math, or module:function), reward_pretrain, "
            "grm_pretrain or remote_rm_url (or no_task_reward with on_policy_distillation)"
        )
    if config.reward_fn not in (None, "math") and ":" not in str(config.reward_fn):
        raise ConfigError(f"reward_fn {config.reward_fn!r} must be 'math' or 'module:function'")
    if config.pretrain is None and config.preset is None and config.reward_count:
        raise ConfigError(
            "the built-in demo brings its own reward; reward_fn, reward_pretrain, grm_pretrain "
            "and remote_rm_url need --pretrain or --preset"
        )
    if not config.remote_rm_url:
        for name in (
            "remote_rm_timeout_s",
            "remote_rm_max_attempts",
            "remote_rm_auth_env",
            "remote_rm_protocol",
            "remote_rm_batch_size",
            "remote_rm_max_concurrency",
        ):
            if getattr(config, name) != _default(config, name):
                raise ConfigError(f"{name} applies to remote_rm_url, which is not set")
    if config.remote_rm_auth_env and len(config.remote_rm_auth_env) != len(config.remote_rm_url):
        raise ConfigError(
            f"remote_rm_auth_env has {len(config.remote_rm_auth_env)} entries for "
            f"{len(config.remote_rm_url)} remote_rm_url: give one variable name per URL, in "
            "order (an empty entry sends that service no header), so no token goes to a "
            "service it was not meant for"
        )
    for url, variable in zip(config.remote_rm_url, config.remote_rm_auth_env, strict=False):
        if variable and urllib.parse.urlsplit(url).username is not None:
            raise ConfigError(
                f"remote_rm_url entry {redact(url)!r} has credentials in it (user:password@) "
                f"and remote_rm_auth_env names {variable} for it: both would set its "
                "Authorization header; give one"
            )
    _check_remote_wait(config)
    if config.reward_weights is not None and len(config.reward_weights) != config.reward_count:
        raise ConfigError(
            f"reward_weights has {len(config.reward_weights)} entries for {config.reward_count} "
            f"rewards (reward_fn, then each reward_pretrain, each grm_pretrain, each "
            f"remote_rm_url): give one weight per reward"
        )
    check_judge_settings(config)
    if config.cache_dir is not None and config.preset is None:
        raise ConfigError(
            f"cache_dir {config.cache_dir!r} is where presets keep converted models; "
            "it needs --preset"
        )


GRM_SETTINGS = (
    "grm_template",
    "grm_max_new_tokens",
    "grm_apply_chat_template",
    "grm_unparsable_score",
)
"""The fields that configure the generative reward models; each needs ``grm_pretrain``."""


def check_judge_settings(config: TrainFields) -> None:
    """The judges' settings have judges to apply to, their template is valid and has the
    reference it shows, and per-label recipes replace the weights."""
    from lrft.rewards.judge_template import load_judge_template

    if not config.grm_pretrain:
        for name in GRM_SETTINGS:
            if getattr(config, name) != _default(config, name):
                raise ConfigError(f"{name} applies to grm_pretrain, which is not set")
    else:
        template = load_judge_template(config.grm_template)
        if template.needs_reference and config.reference_key is None:
            raise ConfigError(
                f"grm_template {config.grm_template!r} shows the judge the reference answer: "
                "set --reference_key"
            )
    if config.reward_recipes is not None and config.reward_weights is not None:
        raise ConfigError(
            "reward_recipes gives each label its own weights; reward_weights one set for all: "
            "choose one"
        )


def remote_rounds(config: TrainFields) -> int:
    """The rounds of POSTs one service call makes for a rollout's samples, all on one rank at
    worst: ``remote_rm_batch_size`` samples per POST, ``remote_rm_max_concurrency`` at once."""
    samples = config.rollout_batch_size * config.n_samples_per_prompt
    if config.remote_rm_batch_size is None:
        return 1
    posts = -(-samples // config.remote_rm_batch_size)
    return -(-posts // config.remote_rm_max_concurrency)


def remote_wait_s(config: TrainFields) -> float:
    """How long the reward services keep a rank in the rewards phase when none answers: each
    POST tries ``remote_rm_max_attempts`` times, ``remote_rm_timeout_s`` each, with the client's
    backoff between tries, in :func:`remote_rounds` rounds; the services are called one after the
    other."""
    attempts, timeout = config.remote_rm_max_attempts, config.remote_rm_timeout_s
    waits = sum(retry_backoff_s(failed) for failed in range(1, attempts))
    return len(config.remote_rm_url) * remote_rounds(config) * (attempts * timeout + waits)


def _check_remote_wait(config: TrainFields) -> None:
    # The other ranks wait at the next collective while one rank retries its POSTs: a timeout
    # shorter than that would fail a job whose service is only slow.
    if config.remote_rm_url and config.collective_timeout_s <= remote_wait_s(config):
        raise ConfigError(
            f"collective_timeout_s {config.collective_timeout_s:g} must exceed the "
            f"{remote_wait_s(config):g} s that {len(config.remote_rm_url)} reward service(s) may "
            f"take when none answers ({config.remote_rm_max_attempts} attempts x "
            f"remote_rm_timeout_s {config.remote_rm_timeout_s:g}, plus backoff, per POST, in "
            f"{remote_rounds(config)} round(s) of POSTs each): the other ranks wait that long "
            "at the next collective"
        )


def check_training_settings(config: TrainFields) -> None:
    """The KL loss, the training backend's options, and the batch sizes of one rollout."""
    if config.use_kl_loss and config.init_kl_coef == 0.0:
        raise ConfigError("use_kl_loss needs init_kl_coef > 0 (the KL term's coefficient)")
    fsdp_only = {
        "fsdp_cpu_offload": config.fsdp_cpu_offload,
        "fsdp_reshard_after_forward": not config.fsdp_reshard_after_forward,
        "fsdp_defer_gradient_sync": config.fsdp_defer_gradient_sync,
    }
    for name, changed in fsdp_only.items():
        if config.zero_stage is not None and changed:
            raise ConfigError(
                f"{name} is an FSDP2 setting, but zero_stage={config.zero_stage} "
                "trains with DeepSpeed: choose one"
            )
    if config.deepspeed_config is not None and config.zero_stage is None:
        raise ConfigError(
            f"deepspeed_config {config.deepspeed_config!r} needs zero_stage (1, 2 or 3): "
            "without it lrft trains with FSDP2"
        )
    if config.fsdp_cpu_offload and config.fsdp_defer_gradient_sync:
        raise ConfigError(
            "fsdp_defer_gradient_sync keeps unreduced gradients on the device between "
            "micro-batches, but fsdp_cpu_offload keeps every part on the host: choose one"
        )
    if config.fsdp_cpu_offload and config.adam_offload:
        raise ConfigError(
            "adam_offload moves optimizer state to the host between phases, but "
            "fsdp_cpu_offload already keeps it there for the whole run: choose one"
        )
    samples = config.rollout_batch_size * config.n_samples_per_prompt
    if samples % config.train_batch_size:
        raise ConfigError(
            f"train_batch_size {config.train_batch_size} must divide rollout_batch_size * "
            f"n_samples_per_prompt = {config.rollout_batch_size} * {config.n_samples_per_prompt} "
            f"= {samples} (train_batch_size <= rollout_batch_size * n_samples_per_prompt, "
            f"and a whole number of optimizer steps per rollout)"
        )
    if (
        config.n_samples_per_prompt < 2
        and advantage_estimators.get(config.advantage_estimator).needs_groups
    ):
        raise ConfigError(
            f"advantage_estimator {config.advantage_estimator!r} compares the responses to one "
            f"prompt: n_samples_per_prompt must be >= 2, got {config.n_samples_per_prompt}"
        )


def check_estimator_settings(config: TrainFields) -> None:
    """No setting the chosen estimator would ignore: critic settings need a critic, and
    ``gamma``/``lambd`` need an estimator that reads them."""
    spec = advantage_estimators.get(config.advantage_estimator)
    if not spec.needs_values:
        for name in CRITIC_SETTINGS:
            if getattr(config, name) is not None:
                raise ConfigError(
                    f"{name} configures the critic, but advantage_estimator "
                    f"{config.advantage_estimator!r} trains none: critic settings need a "
                    f"value-based estimator ({', '.join(value_based_estimators())})"
                )
    for name in ("gamma", "lambd", "opd_kl_coef"):
        if getattr(config, name) is not None and name not in spec.reads:
            readers = [s.name for s in advantage_estimators if name in s.reads]
            raise ConfigError(
                f"{name} is read only by the advantage estimators {', '.join(readers)}; "
                f"advantage_estimator {config.advantage_estimator!r} does not use it"
            )


def check_algorithm_settings(config: TrainFields) -> None:
    """No policy-loss or sampling setting that would be ignored or that the loss refuses."""
    for setting, switch in ALGORITHM_SETTINGS:
        if getattr(config, setting) is not None and not getattr(config, switch):
            raise ConfigError(
                f"{setting} {getattr(config, setting)!r} is read only with {switch}; "
                f"set {switch} or leave {setting} unset"
            )
    if config.eps_clip_low_high is not None:
        low, high = config.eps_clip_low_high
        if not 0.0 < low < 1.0 or not 0.0 < high < float("inf"):
            raise ConfigError(
                f"eps_clip_low_high ({low}, {high}): LOW must be in (0, 1) and HIGH > 0 "
                f"(the ratio is clipped to [1 - LOW, 1 + HIGH])"
            )
        if config.eps_clip != _default(config, "eps_clip"):
            raise ConfigError(
                f"eps_clip {config.eps_clip} and eps_clip_low_high {config.eps_clip_low_high} are "
                "both set, but eps_clip_low_high replaces eps_clip: set one"
            )
    spec = policy_losses.get(config.policy_loss_type)
    token_level = {
        "loss_agg_mode": config.loss_agg_mode is not None,
        "high_entropy_token_ratio": config.high_entropy_token_ratio > 0,
    }
    for name, is_set in token_level.items():
        if is_set and spec.sequence_level:
            raise ConfigError(
                f"{name} applies to token-level losses, but policy_loss_type "
                f"{config.policy_loss_type!r} is sequence-level (one ratio per response, "
                f"averaged over responses): leave {name} unset"
            )
    if (
        config.overlong_buffer_len is not None
        and config.overlong_buffer_len > config.generate_max_len
    ):
        raise ConfigError(
            f"overlong_buffer_len {config.overlong_buffer_len} exceeds generate_max_len "
            f"{config.generate_max_len} (the buffer is the last tokens before that limit)"
        )
    if config.dynamic_sampling and config.n_samples_per_prompt < 2:
        raise ConfigError(
            f"dynamic_sampling drops prompts whose responses all score the same, which needs "
            f"n_samples_per_prompt >= 2, got {config.n_samples_per_prompt}"
        )


def check_policy_loss(config: TrainFields, loss_config: PolicyLossConfig) -> None:
    """``policy_loss_type`` accepts the settings ``loss_config`` gives it (derived from the
    fields by :meth:`lrft.config.TrainConfig.policy_loss_config`)."""
    # A loss refuses the settings it does not read (a dual clip for gspo, say) only when it is
    # called; one call on a one-token batch moves that error here, before any process starts,
    # for losses registered by users as well.
    one = torch.zeros(1, 1)
    inputs = PolicyLossInputs(
        logprobs=one,
        old_logprobs=one,
        advantages=one,
        action_mask=torch.ones(1, 1, dtype=torch.bool),
        engine_logprobs=one if config.use_tis else None,
    )
    loss = policy_losses.get(config.policy_loss_type).fn
    try:
        loss(inputs, loss_config)
    except ConfigError as error:
        raise ConfigError(f"policy_loss_type {config.policy_loss_type!r}: {error}") from error


def check_observability_settings(config: TrainFields) -> None:
    """Neither W&B nor trajectory settings are set while they are off (whether W&B is
    installed: :mod:`lrft.config.packages`)."""
    if not config.use_wandb:
        for name in WANDB_SETTINGS:
            if getattr(config, name) is not None:
                raise ConfigError(
                    f"{name} {getattr(config, name)!r} needs use_wandb (without it nothing "
                    "is logged to W&B)"
                )
    if config.save_trajectories_steps is not None and not config.save_trajectories:
        raise ConfigError(
            f"save_trajectories_steps {config.save_trajectories_steps} needs save_trajectories "
            "(without it no trajectory is saved)"
        )


def check_engine_settings(config: TrainFields) -> None:
    """The engine can run at ``engine_tp_size`` and reads ``hf_decode`` and
    ``engine_mem_util``: the facts its registry entry declares (an engine that declares none,
    an entry point's, has its TP size checked once built, against its capabilities)."""
    facts = registry.engine_facts(config.engine_type) or registry.EngineFacts()
    tp = config.engine_tp_size
    if facts.max_tp is not None and tp > facts.max_tp:
        spanning = _engines(lambda other: other.max_tp is None or other.max_tp >= tp)
        raise ConfigError(
            f"engine_tp_size {tp} exceeds engine {config.engine_type!r}'s maximum "
            f"tensor-parallel size {facts.max_tp} (--engine_type {spanning} spans a TP group)"
        )
    if config.hf_decode != "auto" and not facts.decode_paths:
        raise ConfigError(
            f"hf_decode {config.hf_decode!r} picks the "
            f"{_engines(lambda other: bool(other.decode_paths))} engine's decoding path, but "
            f"engine_type is {config.engine_type!r}: leave hf_decode at 'auto'"
        )
    if config.engine_mem_util is not None and not facts.reserves_memory:
        reserving = _engines(lambda other: other.reserves_memory)
        raise ConfigError(
            f"engine_mem_util {config.engine_mem_util} sizes the memory the {reserving} engine "
            f"reserves up front; engine {config.engine_type!r} reserves none (it allocates as it "
            f"generates): leave engine_mem_util unset or use engine_type {reserving}"
        )


def _engines(declaring: Callable[[registry.EngineFacts], bool]) -> str:
    """The registered engines whose facts satisfy ``declaring``, as ``a or b``."""
    facts = registry.declared_engine_facts()
    return " or ".join(name for name, declared in facts.items() if declaring(declared))


def validate_world(config: TrainFields, world_size: int) -> None:
    """See :meth:`lrft.config.TrainConfig.validate_world`."""
    ranks = "world size"
    if config.placement == "split":
        # the engines' ranks are checked there; the batch rules below are the trainer ranks'
        world_size, _ = validate_split_world(config, world_size)
        ranks = "trainer ranks"
    elif world_size % config.engine_tp_size:
        raise ConfigError(
            f"world size {world_size} is not divisible by engine_tp_size "
            f"{config.engine_tp_size} (world_size % engine_tp_size must be 0)"
        )
    if config.rollout_batch_size % world_size:
        raise ConfigError(
            f"rollout_batch_size {config.rollout_batch_size} is not divisible by world size "
            f"{world_size} (each rank rolls out an equal share of the prompts)"
        )
    # a sequence-parallel group trains one share of the batch
    shares = long_sequences.data_parallel_size(config, world_size)
    what = ranks if shares == world_size else "sequence-parallel groups"
    per_rank = config.train_batch_size // shares
    if config.train_batch_size % shares or per_rank % config.micro_train_batch_size:
        raise ConfigError(
            f"train_batch_size {config.train_batch_size} must equal {what} {shares} x "
            f"micro_train_batch_size {config.micro_train_batch_size} x an integer (gradient "
            f"accumulation steps)"
        )


# --- LoRA --------------------------------------------------------------------------------------

LORA_SETTINGS = ("lora_alpha", "lora_dropout", "target_modules")
"""The fields that shape the LoRA adapters; each needs ``lora_rank``."""


def check_lora_settings(config: TrainFields) -> None:
    """Adapter settings need adapters (``lora_rank``); whether peft is installed:
    :mod:`lrft.config.packages`."""
    if config.lora_rank == 0:
        for name in LORA_SETTINGS:
            if getattr(config, name) != _default(config, name):
                raise ConfigError(
                    f"{name} {getattr(config, name)!r} shapes LoRA adapters, but lora_rank is "
                    "0 (the whole model is trained): set lora_rank"
                )
        return
