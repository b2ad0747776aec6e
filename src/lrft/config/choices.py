"""The names some settings of :class:`lrft.config.TrainConfig` choose among: the rollout
engines, the hf engine's decoding paths, the presets and the built-in demos. ``lrft train``'s
flags offer the same choices (:mod:`lrft.cli.flags`).

What an engine is (its maximum TP size, its decoding paths, whether it reserves memory) is
declared on its registry entry (:class:`lrft.backends.registry.EngineFacts`); the names here
that restate it are read from there.
"""

from __future__ import annotations

from typing import Literal

from lrft.backends import registry

EngineType = Literal["hf", "vllm"]
ENGINE_MAX_TP: dict[str, int | None] = {
    name: facts.max_tp for name, facts in registry.declared_engine_facts().items()
}
"""The largest tensor-parallel size of each engine lrft registers (``None``: any size that
divides the world size), as when this module was imported; kept for one release: read
``registry.engine_facts(name).max_tp``, which also knows engines registered later."""
HF_DECODE_PATHS = registry.declared_engine_facts()["hf"].decode_paths
"""The hf engine's decoding paths (``HFEngineConfig.decode``), from its registry entry."""
PRESET_NAMES: tuple[str, ...] = ("smollm2",)
"""The presets ``lrft train --preset`` offers; each is defined in :mod:`lrft.presets`."""
DEMO_NAMES: tuple[str, ...] = ("addition", "vision", "calculator")
"""The built-in demos ``lrft train --demo`` runs when no model is given: two-digit addition on a
tiny Qwen2 (:mod:`lrft.demos`), counting shapes in images on a tiny Qwen2-VL
(:mod:`lrft.demos.vision`), or 3-digit addition with a calculator tool in multi-turn episodes
(:mod:`lrft.demos.calculator`)."""
