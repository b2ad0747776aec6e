"""The rules of :class:`lrft.config.TrainConfig` on packing and sequence parallelism
(docs/long-sequences.md): sequence parallelism splits packed rows, over a whole number of
groups. The rules that read the model (its family, its heads) run before the process group
starts, from its config (:func:`lrft.models.packed_attention.check_packing_support`)."""

from __future__ import annotations

from lrft.api.errors import ConfigError
from lrft.config.fields import TrainFields


def check_long_sequence_settings(config: TrainFields) -> None:
    """Sequence parallelism needs packing; packing takes no audio."""
    if config.sequence_parallel_size > 1 and not config.packing_samples:
        raise ConfigError(
            f"sequence_parallel_size {config.sequence_parallel_size} splits packed rows: it "
            "needs packing_samples"
        )
    if config.packing_samples and config.audios_key is not None:
        raise ConfigError(
            f"packing_samples does not pack audio (audios_key {config.audios_key!r}): "
            "lrft packs text and image rows only"
        )


def data_parallel_size(config: TrainFields, world_size: int) -> int:
    """The number of data-parallel shares at ``world_size`` ranks (one per sequence-parallel
    group); raises ``ConfigError`` when the groups do not fill the world."""
    size = config.sequence_parallel_size
    if world_size % size:
        raise ConfigError(
            f"world size {world_size} is not divisible by sequence_parallel_size {size} "
            f"(world_size % sequence_parallel_size = {world_size % size}, must be 0)"
        )
    return world_size // size
