"""The names some settings of :class:`lrft.config.TrainConfig` choose among: the rollout
engines, the hf engine's decoding paths, the presets and the built-in demos. ``lrft train``'s flags offer the same
choices (:mod:`lrft.cli.flags`)."""

from __future__ import annotations

from typing import Literal

EngineType = Literal["hf", "vllm"]
ENGINE_MAX_TP: dict[str, int | None] = {"hf": 1, "vllm": None}
"""The largest tensor-parallel size each built-in engine supports (its ``max_tp`` capability);
``None``: any size that divides the world size."""
HF_DECODE_PATHS = ("auto", "generate", "static", "cuda_graph", "compiled")
"""The hf engine's decoding paths (``HFEngineConfig.decode``)."""
PRESET_NAMES: tuple[str, ...] = ("smollm2",)
"""The presets ``lrft train --preset`` offers; each is defined in :mod:`lrft.presets`."""
DEMO_NAMES: tuple[str, ...] = ("addition", "vision", "calculator")
"""The built-in demos ``lrft train --demo`` runs when no model is given: two-digit addition on a
tiny Qwen2 (:mod:`lrft.demos`), counting shapes in images on a tiny Qwen2-VL
(:mod:`lrft.demos.vision`), or 3-digit addition with a calculator tool in multi-turn episodes
(:mod:`lrft.demos.calculator`)."""
