"""Backends by name, lazy optional imports, and the promise that ``import lrft`` stays light."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from lrft.api import ConfigError
from lrft.backends import registry
from lrft.backends.rollout.hf import HFRolloutEngine
from lrft.backends.sync.direct import DirectSync
from lrft.backends.train.fsdp2 import FSDP2Backend
from tests.unit._plugins.third_party import ThirdPartyEngine


def test_builtins_load_by_name() -> None:
    assert registry.load("train", "fsdp2") is FSDP2Backend
    assert registry.load("rollout", "hf") is HFRolloutEngine
    assert registry.load("sync", "direct") is DirectSync


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown rollout backend 'nope'; known: .*hf"):
        registry.load("rollout", "nope")


def test_missing_optional_dependency_names_the_extra() -> None:
    registry.register(
        "rollout", "missing-dep", "tests.unit._plugins.needs_missing_package:Backend", extra="vllm"
    )
    with pytest.raises(ImportError, match=r"pip install 'lrft\[vllm\]'") as caught:
        registry.load("rollout", "missing-dep")
    assert "lrft_package_that_does_not_exist" in str(caught.value)


def test_conflicting_registration_raises() -> None:
    with pytest.raises(ConfigError, match="already registered"):
        registry.register("train", "fsdp2", "somewhere.else:Backend")


def test_bad_target_raises() -> None:
    with pytest.raises(ConfigError, match="must look like"):
        registry.register("train", "bad", "no_colon_here")


def test_entry_points_are_discovered(monkeypatch: pytest.MonkeyPatch) -> None:
    point = importlib.metadata.EntryPoint(
        name="third-party",
        value="tests.unit._plugins.third_party:ThirdPartyEngine",
        group=registry.ENTRY_POINT_GROUPS["rollout"],
    )
    real = importlib.metadata.entry_points

    def entry_points(*, group: str) -> importlib.metadata.EntryPoints:
        if group == point.group:
            return importlib.metadata.EntryPoints([point])
        return real(group=group)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert "third-party" in registry.entries("rollout")
    assert registry.load("rollout", "third-party") is ThirdPartyEngine


def test_import_lrft_imports_no_optional_engine() -> None:
    code = (
        "import sys, lrft, lrft.api, lrft.dist, lrft.algo, lrft.backends.registry;"
        "heavy = sorted(m for m in ('deepspeed', 'vllm', 'sglang') if m in sys.modules);"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
