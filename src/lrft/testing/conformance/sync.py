"""``WeightSyncSuite[S]``: the shared conformance tests of a ``WeightSync``.

A subclass says how to build the sync under test, the train backend that feeds it, the engine it
fills, and a backdoor that reads the engine's weights without the API under test::

    class TestDirectSync(WeightSyncSuite[DirectSync]):
        world_size = 2

        @classmethod
        def make_sync(cls, bucket_bytes: int) -> DirectSync:
            return DirectSync(bucket_bytes=bucket_bytes)

        @classmethod
        def make_engine(
            cls, model_dir: Path, dtype: torch.dtype, device: torch.device
        ) -> HFRolloutEngine:
            return HFRolloutEngine.from_pretrained(
                model_dir, config=HFEngineConfig(device=device, dtype=dtype)
            )
        ...

The reference is plain: the trained weights gathered through ``full_weights`` are loaded into a
plain transformers model whose greedy tokens (a full forward per token) the engine must reproduce.
Verification is what the sync declares: one that declares ``verifies_digest`` must report
``verified=True`` and catch corruption; one that does not must report ``verified=False``. The
suite puts proxies between the sync and the real engine (they forward every attribute): a sync
must reach the engine through its ``RolloutEngine`` API.

Each test ``test_<what>`` runs the check ``check_<what>`` on every rank: a module-level
function taking the suite class and a model folder (registered with ``SYNC_CHECKS``;
``lrft.testing.conformance._registry``), served here by name with the proxies, so it can also
run on a harness of your own (inside ranks of an initialised process group).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lrft.testing.audio_models import save_tiny_audio_lm

# The check modules register their checks with SYNC_CHECKS as they are imported.
from lrft.testing.conformance import (  # noqa: F401
    _sync_changes_checks,
    _sync_checks,
    _sync_serving_checks,
)
from lrft.testing.conformance._registry import SYNC_CHECKS, RegisteredCheck
from lrft.testing.conformance._sync_checks import trained_source
from lrft.testing.conformance._sync_hooks import S, WeightSyncHooks
from lrft.testing.conformance._sync_proxies import (
    CorruptInTransit,
    CountsEngineCalls,
    LoaderProxy,
    MisdirectInPlace,
    StreamProbe,
)
from lrft.testing.conformance._sync_serving_checks import SyncMediaModels
from lrft.testing.distributed import RankPool
from lrft.testing.vision_models import save_tiny_vlm

__all__ = [
    "CorruptInTransit",
    "CountsEngineCalls",
    "LoaderProxy",
    "MisdirectInPlace",
    "StreamProbe",
    "SyncMediaModels",
    "WeightSyncSuite",
    *SYNC_CHECKS.function_names(),
    "trained_source",
]


def __getattr__(name: str) -> Callable[..., Any]:
    """Every registered check, by its name (``check_sync_after_training``, ...)."""
    return SYNC_CHECKS.lookup(name)


_MEDIA_MODELS: dict[tuple[Path, tuple[int, int]], SyncMediaModels] = {}


class WeightSyncSuite(WeightSyncHooks[S]):
    """Conformance tests every ``WeightSync`` must pass (see ``lrft.api.WeightSync``): one
    ``test_<what>`` per registered check ``check_<what>``."""

    @pytest.fixture(scope="class")
    @classmethod
    def media_model_dirs(cls, tmp_path_factory: pytest.TempPathFactory) -> SyncMediaModels:
        """The tiny Qwen2-VL and Qwen2-Audio folders, built once per session and heads."""
        key = (tmp_path_factory.getbasetemp(), cls.model_heads)
        if key not in _MEDIA_MODELS:
            q, kv = cls.model_heads
            root = tmp_path_factory.mktemp("sync-media-models")
            heads = {"num_attention_heads": q, "num_key_value_heads": kv}
            _MEDIA_MODELS[key] = SyncMediaModels(
                vlm_dir=save_tiny_vlm(root / "vlm", seed=0, **heads),
                audio_dir=save_tiny_audio_lm(root / "audio", seed=0, **heads),
            )
        return _MEDIA_MODELS[key]

    def run_check(self, pool: RankPool, check: Callable[..., Any], *fixtures: Any) -> None:
        """``check(suite class, *fixtures)`` on every rank of ``pool``."""
        pool.run(check, type(self), *fixtures)

    def run_registered(self, pool: RankPool, check: RegisteredCheck, *fixtures: Any) -> None:
        self.run_check(pool, check.function, *fixtures)


SYNC_CHECKS.add_tests(WeightSyncSuite)
