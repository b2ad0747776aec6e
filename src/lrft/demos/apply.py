"""The model and data of a run that names none of its own: a preset's, or the built-in demo's.

``lrft train`` applies them before it builds the trainer (:func:`apply_demo_or_preset`), so
that :func:`lrft.trainer.build.build_trainer` always receives a complete configuration. The
run's folders are claimed first: a run that may not write there stops before the demo or the
preset writes its prompt files.
"""

from __future__ import annotations

from lrft.api.errors import ConfigError
from lrft.config import TrainConfig
from lrft.demos.settings import chosen_demo_config
from lrft.presets import preset_config
from lrft.run.outputs import claim_outputs


def apply_demo_or_preset(config: TrainConfig, rank: int) -> TrainConfig:
    """``config`` with a preset's model and data wherever the user gave none, or, with no
    ``pretrain``, the demo's (written under ``save_path`` by each rank); unchanged otherwise.
    Collective-free: runs before the process group starts."""
    removed = claim_outputs(config, rank=rank)
    if removed is not None:
        print(removed, flush=True)
    if config.preset is not None:
        return preset_config(config, rank)
    if config.pretrain is None:
        return chosen_demo_config(config, rank)
    if config.demo != "addition":
        raise ConfigError(
            f"demo {config.demo!r} runs only when no pretrain is given (it brings its own "
            f"model and data), but pretrain is {config.pretrain!r}"
        )
    return config
