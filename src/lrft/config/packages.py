"""The optional packages a configuration needs, each missing one named with the line that
installs it.

Checked with the settings, before any process group starts, and all at once: a command line
that needs W&B, vLLM and math-verify on a machine with none of them gets one message with three
``pip install`` lines, not three attempts. The probes look packages up without importing them.
"""

from __future__ import annotations

from lrft import extras
from lrft.api.errors import ConfigError
from lrft.backends import registry
from lrft.config.fields import TrainFields
from lrft.config.knobs import train_backend_name


def missing_packages(config: TrainFields) -> tuple[str, ...]:
    """One problem for each optional package ``config`` needs and this environment lacks: those
    its backends declare in the registry (vLLM, DeepSpeed, a plug-in's), then those of its
    other settings."""
    needs = (
        (
            config.use_wandb,
            extras.wandb_available,
            "use_wandb needs the wandb package",
            extras.WANDB_EXTRA,
        ),
        (
            config.lora_rank > 0,
            extras.peft_available,
            f"lora_rank {config.lora_rank} needs the peft package",
            extras.LORA_EXTRA,
        ),
        (
            config.reward_fn == "math",
            # imported only by the verifier's worker process at the first scoring, long after
            # the ranks have started and loaded their models: hence checked here
            extras.math_verify_available,
            "--reward_fn math needs the math-verify package",
            extras.REWARDS_EXTRA,
        ),
        (
            bool(config.remote_rm_url),
            extras.httpx_available,
            "remote_rm_url needs the httpx package",
            extras.REWARDS_EXTRA,
        ),
    )
    chosen: tuple[tuple[registry.Kind, str], ...] = (
        ("rollout", config.engine_type),
        ("train", train_backend_name(config)),
        ("sync", config.weight_sync),
    )
    backends = tuple(
        problem for kind, name in chosen for problem in registry.missing_packages(kind, name)
    )
    return backends + tuple(
        f"{need}, which is not installed: {line}"
        for wanted, available, need, line in needs
        if wanted and not available()
    )


def check_packages(config: TrainFields) -> None:
    """Raise one ``ConfigError`` naming every missing package ``config`` needs."""
    missing = missing_packages(config)
    if missing:
        raise ConfigError(*missing)
