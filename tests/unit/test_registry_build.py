"""One build path for every backend (:mod:`lrft.backends.registry`): lrft's own through their
entries' builders, a package's through ``from_spec``, each handed its kind's spec with the
options its facts call for; the settings are checked against the facts the entries declare."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch

from lrft.api import EngineSpec, TrainBackendSpec, WeightSyncSpec, read_options
from lrft.api.errors import ConfigError
from lrft.backends import registry
from lrft.backends.registry import BackendEntry, EngineFacts, Kind
from lrft.backends.rollout import hf
from lrft.backends.sync.direct import DirectSync
from lrft.backends.train.deepspeed import DeepSpeedConfig
from lrft.backends.train.fsdp2 import FSDP2Config
from lrft.config import HF_DECODE_PATHS, TrainConfig
from lrft.dist import RankInfo
from lrft.trainer.components import engine_spec, rollout_engine, train_backend
from tests.installed import pretend_installed
from tests.trainer.fixtures import make_model_folder

CPU = torch.device("cpu")
INFO = RankInfo(rank=0, local_rank=0, world_size=2, local_world_size=2, device=CPU)


class Captured(Exception):
    """Raised by a builder instead of building: carries the spec it was handed."""

    def __init__(self, spec: object) -> None:
        super().__init__("captured")
        self.spec = spec


def capture(spec: object) -> object:
    raise Captured(spec)


class CapturedBackend:
    """A package's backend whose ``from_spec`` hands back its spec."""

    from_spec = staticmethod(capture)


def _register(
    monkeypatch: pytest.MonkeyPatch, kind: Kind, name: str, facts: EngineFacts | None = None
) -> None:
    known = BackendEntry(kind=kind, name=name, target=f"{__name__}:CapturedBackend", engine=facts)
    monkeypatch.setitem(registry._REGISTRY, (kind, name), known)


def _captured_spec(build: object, *args: object) -> object:
    assert callable(build)
    with pytest.raises(Captured) as caught:
        build(*args)
    return caught.value.spec


@pytest.fixture
def builtins_captured(monkeypatch: pytest.MonkeyPatch) -> None:
    """lrft's own train backends, their builders replaced by :func:`capture`."""
    for name in ("fsdp2", "deepspeed"):
        known = registry._REGISTRY[("train", name)]
        replaced = attrs.evolve(known, builder=f"{__name__}:capture")
        monkeypatch.setitem(registry._REGISTRY, ("train", name), replaced)


def test_the_config_and_the_hf_engine_read_their_decode_paths_from_its_entry(
    tmp_path: Path,
) -> None:
    facts = registry.engine_facts("hf")
    assert facts is not None
    assert HF_DECODE_PATHS == hf.DECODE_PATHS == facts.decode_paths
    with pytest.raises(ConfigError, match="decode must be one of"):
        hf.HFEngineConfig(decode="fast")
    spec = EngineSpec(
        model_dir=str(make_model_folder(tmp_path / "model")),
        device=CPU,
        dtype=torch.float32,
        max_batch_size=2,
        options={"decode": "static"},
    )
    engine = registry.build_engine("hf", spec)
    try:
        assert isinstance(engine, hf.HFRolloutEngine)
        assert engine.decode_path == "static"
        # the fact the config checks before building is the capability the engine declares
        assert engine.capabilities.max_tp == facts.max_tp == 1
    finally:
        engine.shutdown()


def test_lrfts_sync_is_built_from_its_spec_like_a_packages() -> None:
    built = registry.build_sync("direct", WeightSyncSpec(bucket_bytes=4096, verify=False))
    assert built == DirectSync(bucket_bytes=4096, verify=False)


def test_an_option_a_backend_does_not_take_is_refused_naming_it() -> None:
    spec = EngineSpec(
        model_dir="m", device=CPU, dtype=torch.float32, max_batch_size=1, options={"share": 0.5}
    )
    with pytest.raises(ConfigError, match=r"rollout engine 'hf' takes no option 'share'; it takes"):
        registry.build_engine("hf", spec)
    with pytest.raises(ConfigError, match=r"zero_stage must be 1, 2 or 3, got 4"):
        read_options(DeepSpeedConfig, {"zero_stage": 4}, backend="train backend 'deepspeed'")


@pytest.mark.usefixtures("builtins_captured")
def test_a_train_backend_gets_the_settings_named_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fsdp = _captured_spec(train_backend, TrainConfig(fsdp_cpu_offload=True), INFO)
    assert isinstance(fsdp, TrainBackendSpec)
    assert (fsdp.device, fsdp.seed) == (CPU, 42)
    assert read_options(FSDP2Config, fsdp.options, backend="fsdp2") == FSDP2Config(
        cpu_offload=True, reshard_after_forward=True, defer_gradient_sync=False
    )
    zero = _captured_spec(train_backend, TrainConfig(zero_stage=3), INFO)
    assert isinstance(zero, TrainBackendSpec)
    assert read_options(DeepSpeedConfig, zero.options, backend="deepspeed") == DeepSpeedConfig(
        zero_stage=3
    )
    _register(monkeypatch, "train", "package")
    package = _captured_spec(train_backend, TrainConfig(train_backend="package"), INFO)
    assert isinstance(package, TrainBackendSpec)
    assert dict(package.options) == {}


def test_an_engine_gets_the_options_its_facts_call_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    pretend_installed(monkeypatch, vllm=True)
    _register(monkeypatch, "rollout", "reserving", EngineFacts(max_tp=2, reserves_memory=True))
    _register(monkeypatch, "rollout", "plain")
    config = TrainConfig(engine_type="reserving", engine_mem_util=0.3, n_samples_per_prompt=4)
    spec = _captured_spec(rollout_engine, "m", config, INFO)
    assert isinstance(spec, EngineSpec)
    assert dict(spec.options) == {"memory_share": 0.3}
    assert spec.max_batch_size == config.micro_rollout_batch_size * 4
    plain = _captured_spec(rollout_engine, "m", TrainConfig(engine_type="plain"), INFO)
    assert isinstance(plain, EngineSpec)
    assert dict(plain.options) == {}
    # vLLM on the CPU, unset: half the host, shared by the node's 2 ranks
    vllm = engine_spec("m", TrainConfig(engine_type="vllm"), INFO)
    assert dict(vllm.options) == {"memory_share": 0.25}
    hf_spec = engine_spec("m", TrainConfig(hf_decode="static"), INFO)
    assert dict(hf_spec.options) == {"decode": "static"}


class CapturedVLLM:
    """Stands for the vLLM adapter: hands back the config it was given instead of starting."""

    def __init__(self, model_dir: str, *, config: object) -> None:
        raise Captured(config)


def test_the_vllm_engine_is_configured_from_its_spec_and_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lrft.backends.rollout import vllm

    monkeypatch.setattr(vllm, "VLLMRolloutEngine", CapturedVLLM)
    pretend_installed(monkeypatch, vllm=True)
    config = TrainConfig(
        engine_type="vllm",
        engine_tp_size=2,
        engine_mem_util=0.3,
        micro_rollout_batch_size=3,
        n_samples_per_prompt=4,
        prompt_max_len=100,
        generate_max_len=28,
        seed=5,
    )
    built = _captured_spec(rollout_engine, "m", config, INFO)
    # each rank's 3 prompts x 4 samples, two ranks per engine
    assert built == vllm.VLLMEngineConfig(
        dtype=torch.float32,
        tp_size=2,
        max_model_len=128,
        max_num_seqs=24,
        gpu_memory_utilization=0.3,
        seed=5,
    )


def test_the_settings_are_checked_against_the_declared_facts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _register(monkeypatch, "rollout", "reserving", EngineFacts(max_tp=2, reserves_memory=True))
    with pytest.raises(
        ConfigError,
        match=r"engine_tp_size 4 exceeds engine 'reserving''s maximum tensor-parallel size 2 "
        r"\(--engine_type vllm spans a TP group\)",
    ):
        TrainConfig(engine_type="reserving", engine_tp_size=4)
    with pytest.raises(ConfigError, match=r"reserves none .* use engine_type reserving or vllm"):
        TrainConfig(engine_type="hf", engine_mem_util=0.3)
    with pytest.raises(ConfigError, match=r"picks the hf engine's decoding path"):
        TrainConfig(engine_type="reserving", hf_decode="static")


def test_an_entry_is_refused_when_malformed() -> None:
    with pytest.raises(ConfigError, match=r"builder 'nocolon' must look like"):
        BackendEntry(kind="rollout", name="x", target="a:B", builder="nocolon")
    with pytest.raises(ConfigError, match=r"train backend 'x': only rollout engines have facts"):
        BackendEntry(kind="train", name="x", target="a:B", engine=EngineFacts())
