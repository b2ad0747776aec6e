"""The vision demo: ``lrft train --demo vision`` trains a tiny Qwen2-VL to count the shapes drawn
into small images, with an exact-answer rule reward; model, processor and task made in-repo and
shipped with the package.

Read top-down: :mod:`lrft.demos.vision.task` (scenes, their images and prompt files),
:mod:`lrft.demos.vision.model` (the architecture, tokenizer, processor files and the
shipped folder :data:`ASSETS_DIR`, warmed up by ``scripts/make_vision_demo_model.py`` on answers
that often overcount, so that RL has clear headroom), :mod:`lrft.demos.vision.settings`
(the demo's settings and config). Pillow draws and reads the images.
"""

from lrft.demos.vision.model import ASSETS_DIR
from lrft.demos.vision.settings import VISION_DEMO_SETTINGS, vision_demo_config
from lrft.demos.vision.task import Scene, ShapeCountTask

__all__ = ["ASSETS_DIR", "VISION_DEMO_SETTINGS", "Scene", "ShapeCountTask", "vision_demo_config"]
