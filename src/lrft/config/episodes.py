"""The rules of the multi-turn settings (``environment``, ``tools``, the episode budget) across
fields, and the budget's defaults."""

from __future__ import annotations

from lrft.api.errors import ConfigError
from lrft.config.fields import TrainFields

DEFAULT_MAX_TURNS = 4
DEFAULT_MAX_EPISODE_TOKENS = 1024

_SINGLE_TURN_ONLY = {
    "dynamic_sampling": "refills its batch with single-turn generate rounds",
    "normalize_reward": "scales one score per response, not per-turn rewards",
    "overlong_buffer_len": "shapes one response's length against generate_max_len",
    "use_fire_sampling": "samples a response's first token hot, not each turn's",
    "apply_chat_template": (
        "formats a single-turn prompt; the environment renders the row's input itself (its "
        "chat_template option)"
    ),
    "input_template": "formats a single-turn prompt; the environment starts from the row's input",
    "images_key": "reads images into a single-turn prompt; episodes carry text turns only",
    "audios_key": "reads audio clips into a single-turn prompt; episodes carry text turns only",
}
"""Settings that act on one response per sample, and why they do not apply to an episode."""


def check_episode_settings(config: TrainFields) -> None:
    """``tools`` and the budget need an ``environment``; the single-turn-only settings refuse
    one; an episode has room for its turns."""
    if config.environment is None:
        for name in ("environment_options", "tools", "max_turns", "max_episode_tokens"):
            if getattr(config, name) not in (None, ()):
                raise ConfigError(f"{name} {getattr(config, name)!r} needs an environment")
        return
    for name, reason in _SINGLE_TURN_ONLY.items():
        if getattr(config, name) not in (None, False):
            raise ConfigError(
                f"{name} does not apply to multi-turn episodes (environment "
                f"{config.environment!r}): it {reason}"
            )
    total = config.max_episode_tokens or DEFAULT_MAX_EPISODE_TOKENS
    if config.prompt_max_len is not None and config.prompt_max_len >= total:
        raise ConfigError(
            f"prompt_max_len {config.prompt_max_len} leaves no room for a model turn in "
            f"max_episode_tokens {total}"
        )
