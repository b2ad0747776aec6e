"""Backends chosen by registered name (:mod:`lrft.trainer.plugins`): a package's class is built
with its ``from_spec`` and checked against its Protocol; ``--plugins`` modules are imported
before the settings are read."""

from __future__ import annotations

import pytest
import torch

from lrft.api import EngineSpec, TrainBackendSpec, WeightSyncSpec
from lrft.api.errors import ConfigError
from lrft.backends import registry
from lrft.backends.registry import Kind
from lrft.backends.sync.direct import DEFAULT_BUCKET_BYTES
from lrft.cli import config_from_args
from lrft.trainer.components import weight_sync
from lrft.trainer.plugins import import_plugins, plugin_engine, plugin_sync, plugin_train_backend

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]


class NoFromSpec:
    """A registered class lrft train cannot build: it has no from_spec."""


class TinyEngine:
    """Builds from its spec, but declares a TP size of 1 (and lacks the rest of an engine)."""

    @classmethod
    def from_spec(cls, spec: EngineSpec) -> TinyEngine:
        return cls()


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    # registered for this test only (monkeypatch restores the registry)
    added: list[tuple[Kind, str, str]] = [
        ("sync", "no-from-spec", "NoFromSpec"),
        ("train", "no-from-spec", "NoFromSpec"),
        ("rollout", "tiny", "TinyEngine"),
    ]
    for kind, name, target in added:
        entry = registry.BackendEntry(kind=kind, name=name, target=f"{__name__}:{target}")
        monkeypatch.setitem(registry._REGISTRY, (kind, name), entry)


def test_a_plugins_module_registers_what_the_command_line_then_chooses() -> None:
    import_plugins(["tests.unit._plugins.backends"])
    from tests.unit._plugins.backends import CountingSync

    sync = plugin_sync("counting", WeightSyncSpec(bucket_bytes=1 << 20, verify=False))
    assert isinstance(sync, CountingSync)
    assert sync.spec == WeightSyncSpec(bucket_bytes=1 << 20, verify=False)
    config = config_from_args(
        [*MODEL, "--plugins=tests.unit._plugins.backends", "--weight_sync=counting"]
    )
    built = weight_sync(config)
    assert isinstance(built, CountingSync)
    assert built.spec.bucket_bytes == DEFAULT_BUCKET_BYTES


def test_a_module_that_cannot_be_imported_is_named() -> None:
    with pytest.raises(ConfigError, match=r"plugins entry 'no_such_module_x' cannot be imported"):
        import_plugins(["no_such_module_x"])
    with pytest.raises(ConfigError, match=r"plugins entry 'no_such_module_x' cannot be imported"):
        config_from_args([*MODEL, "--plugins=no_such_module_x"])


@pytest.mark.usefixtures("registered")
def test_a_class_without_from_spec_or_not_a_backend_is_a_config_error() -> None:
    import_plugins(["tests.unit._plugins.backends"])
    with pytest.raises(ConfigError, match=r"sync backend 'no-from-spec' .* has no from_spec"):
        plugin_sync("no-from-spec", WeightSyncSpec(bucket_bytes=1))
    with pytest.raises(ConfigError, match=r"train backend 'no-from-spec' .* has no from_spec"):
        plugin_train_backend("no-from-spec", TrainBackendSpec(device=torch.device("cpu")))
    with pytest.raises(ConfigError, match=r"returned a NotASync, which lacks members of the Weig"):
        plugin_sync("not-a-sync", WeightSyncSpec(bucket_bytes=1))
    spec = EngineSpec(
        model_dir="m", device=torch.device("cpu"), dtype=torch.float32, max_batch_size=1
    )
    with pytest.raises(
        ConfigError, match=r"returned a TinyEngine, which lacks members of the Roll"
    ):
        plugin_engine("tiny", spec)
