"""``EngineMemorySuite[E]`` and ``TrainMemorySuite[B]``: device memory really released, on CUDA.

What no CPU run can see: on CPU an engine whose ``sleep`` is a no-op, or a backend whose
``offload`` keeps the tensors where they are, passes every state check (``module.to("cpu")`` is a
no-op there). These suites measure a CUDA device instead, on a model large enough (~150 M
parameters, ~0.6 GB in fp32) that what must be released dwarfs the CUDA context and library
workspaces. They run on NCCL pools (``device_type = "cuda"``) and skip with a reason where too few
GPUs are visible or the backend does not declare the capability measured.

- Engines that declare ``sleep_frees_memory``: the device's free memory
  (``torch.cuda.mem_get_info``, which sees every allocator, not torch's alone) after ``sleep(level)`` against the engine's
  awake footprint and its weights' bytes (``parameter_specs()``); waking restores the outputs.
- Backends that declare ``offload_parameters`` and ``offload_optimizer``: ``memory_allocated``
  after offloading both against what training allocated; reloading brings it back and training
  goes on.
- ``full_weights``: the peak above the model stays within ``full_weights_peak_buckets`` largest
  buckets, nothing stays allocated after a pass, and every tensor equals the unsharded model's
  cast to the gather dtype (also from parameters offloaded to the host, where declared).
"""

from __future__ import annotations

import abc
import json
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import pytest
import torch
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from lrft.api import (
    GenerationRequest,
    ModelPart,
    OptimizerConfig,
    RolloutEngine,
    SamplingParams,
    TrainBackend,
    WeightsResidency,
)
from lrft.testing.distributed import DeviceType, DistributedSuite, RankPool, current_rank_context

E = TypeVar("E", bound=RolloutEngine)
B = TypeVar("B", bound=TrainBackend)

MIB = 1024 * 1024
#: what must be released, released to at least this fraction (the rest: allocator rounding,
#: workspaces)
FREED_FRACTION = 0.9

__all__ = ["EngineMemorySuite", "TrainMemorySuite", "memory_test_model"]


def memory_test_model(seed: int = 0) -> PreTrainedModel:
    """A ~150 M-parameter Qwen2 (8 layers, hidden 1024, vocabulary 32000) in fp32."""
    config = Qwen2Config(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config)


def _mib(value: float) -> float:
    return round(value / MIB, 1)


def _free(device: torch.device) -> int:
    torch.cuda.synchronize(device)
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def _require_cuda(device: torch.device) -> None:
    if device.type != "cuda":
        pytest.skip(f"device memory is measured on CUDA only; this pool runs on {device}")


class EngineMemorySuite(DistributedSuite, abc.ABC, Generic[E]):
    """Sleep levels release device memory; subclass with ``make_engine``."""

    world_size: ClassVar[int] = 1
    device_type: ClassVar[DeviceType] = "cuda"

    @classmethod
    @abc.abstractmethod
    def make_engine(cls, model_dir: Path, device: torch.device) -> E:
        """An engine serving ``model_dir`` (fp32) on ``device`` (inside a rank)."""

    @classmethod
    def make_model(cls) -> PreTrainedModel:
        """The model measured (override for engines that need other shapes); it must build the
        same on every call."""
        return memory_test_model()

    @pytest.fixture(scope="class")
    @classmethod
    def memory_model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        directory = tmp_path_factory.mktemp("memory-model")
        cls.make_model().save_pretrained(directory)
        return directory

    def test_sleep_frees_device_memory(self, pool: RankPool, memory_model_dir: Path) -> None:
        figures = pool.run(check_sleep_frees_memory, type(self), memory_model_dir)
        print("engine sleep memory per rank:", json.dumps(figures))


def check_sleep_frees_memory(
    suite: type[EngineMemorySuite[Any]], model_dir: Path
) -> dict[str, float]:
    """Per declared level: the awake engine's footprint (free memory before it was built minus
    after a generate) and what ``sleep(level)`` gives back; the figures, in MiB."""
    device = current_rank_context().device
    _require_cuda(device)
    torch.cuda.empty_cache()
    before = _free(device)
    engine = suite.make_engine(model_dir, device)
    figures: dict[str, float] = {}
    try:
        if "sleep_frees_memory" not in engine.capabilities.names():
            pytest.skip(f"{engine.name} engine lacks capability sleep_frees_memory")
        weights = sum(
            torch.Size(spec.shape).numel() * spec.dtype.itemsize
            for spec in engine.parameter_specs().values()
        )
        requests = [GenerationRequest(prompt_token_ids=range(5, 69)) for _ in range(32)]
        params = SamplingParams(temperature=0.0, max_new_tokens=32)
        outputs = [r.output_token_ids for r in engine.generate(requests, params)]
        for version, level in enumerate(sorted(engine.capabilities.sleep_levels), start=2):
            awake = before - _free(device)
            engine.sleep(level)
            freed = _free(device) - (before - awake)
            state = engine.state
            # what the level must release: the KV cache and any other cache (the awake
            # footprint but the weights), and the weights too where they leave the device
            kept = weights if level == 1 and state.weights is WeightsResidency.RESIDENT else 0
            due = awake - kept
            figures |= {
                f"level{level}_awake_mib": _mib(awake),
                f"level{level}_freed_mib": _mib(freed),
                f"level{level}_due_mib": _mib(due),
                "weights_mib": _mib(weights),
            }
            assert awake >= weights, (
                f"the awake engine occupies {_mib(awake)} MiB, less than its weights' "
                f"{_mib(weights)} MiB: the measurement is wrong"
            )
            assert freed >= FREED_FRACTION * due, (
                f"sleep({level}) (weights {state.weights.value}) freed {_mib(freed)} MiB of the "
                f"{_mib(awake)} MiB the awake engine occupies; {_mib(due)} MiB must go (at least "
                f"{FREED_FRACTION:.0%}), weights {_mib(weights)} MiB"
            )
            engine.wake()
            if level == 2:  # the weights were released: stale until loaded
                engine.load_weights(_model_weights(suite), version=version)
            again = [r.output_token_ids for r in engine.generate(requests, params)]
            assert again == outputs, f"outputs changed across sleep({level}) and wake()"
    finally:
        engine.shutdown()
    return figures


def _model_weights(suite: type[EngineMemorySuite[Any]]) -> list[tuple[str, torch.Tensor]]:
    """The weights in ``memory_model_dir``: ``make_model`` builds the same each time."""
    return [(name, p.detach()) for name, p in suite.make_model().named_parameters()]


class TrainMemorySuite(DistributedSuite, abc.ABC, Generic[B]):
    """``offload`` and ``full_weights`` release device memory; subclass with ``make_backend``."""

    world_size: ClassVar[int] = 2
    device_type: ClassVar[DeviceType] = "cuda"
    #: the peak of a ``full_weights`` pass above the model, in largest buckets (the contract
    #: materialises two at most; a sharded gather adds its send buffers)
    full_weights_peak_buckets: ClassVar[float] = 3.0

    @classmethod
    @abc.abstractmethod
    def make_backend(cls) -> B:
        """The backend under test on this rank (bf16 mixed precision is fine here)."""

    @classmethod
    def make_model(cls) -> PreTrainedModel:
        """The model measured; it must build the same on every call."""
        return memory_test_model()

    def test_offload_frees_parameters_and_optimizer(self, pool: RankPool) -> None:
        figures = pool.run(check_offload_frees_memory, type(self))
        print("offload memory per rank:", json.dumps(figures))

    def test_full_weights_holds_few_buckets_and_nothing_after(self, pool: RankPool) -> None:
        figures = pool.run(check_full_weights_memory, type(self))
        print("full_weights memory per rank:", json.dumps(figures))


def check_offload_frees_memory(suite: type[TrainMemorySuite[Any]]) -> dict[str, float]:
    device = current_rank_context().device
    _require_cuda(device)
    backend = suite.make_backend()
    for part in (ModelPart.PARAMETERS, ModelPart.OPTIMIZER):
        if f"offload_{part.value}" not in backend.capabilities.names():
            pytest.skip(f"backend {backend.name} lacks capability offload_{part.value}")
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    model = backend.prepare_trainable(suite.make_model(), optimizer=OptimizerConfig(lr=1e-5))
    vocab = int(getattr(model.module.config, "vocab_size", 32000))
    ids = torch.randint(0, vocab, (2, 128), device=device)
    model.backward(model.module(input_ids=ids, labels=ids).loss)
    report = model.step()
    assert not report.skipped, f"the training step before offloading was skipped: {report}"
    torch.cuda.synchronize(device)
    trained = torch.cuda.memory_allocated(device) - base
    parts = [ModelPart.PARAMETERS, ModelPart.OPTIMIZER]
    model.offload(parts)
    torch.cuda.synchronize(device)
    offloaded = torch.cuda.memory_allocated(device) - base
    model.reload(parts)
    torch.cuda.synchronize(device)
    reloaded = torch.cuda.memory_allocated(device) - base
    figures = {
        "trained_mib": _mib(trained),
        "offloaded_mib": _mib(offloaded),
        "reloaded_mib": _mib(reloaded),
    }
    assert trained - offloaded >= FREED_FRACTION * trained, (
        f"offload([parameters, optimizer]) freed {_mib(trained - offloaded)} MiB of the "
        f"{_mib(trained)} MiB training allocated (at least {FREED_FRACTION:.0%} must go): {figures}"
    )
    assert reloaded >= 0.99 * trained, f"reload brought back less than was offloaded: {figures}"
    model.backward(model.module(input_ids=ids, labels=ids).loss)
    report = model.step()
    assert not report.skipped, f"the training step after reload was skipped: {report}"
    return figures


def check_full_weights_memory(suite: type[TrainMemorySuite[Any]]) -> dict[str, float]:
    """Three passes of bf16 ``full_weights`` (the second may reuse the first's plans; the third
    from parameters offloaded to the host, where declared): peak and leftover memory, and every
    tensor against the unsharded model cast to bf16."""
    device = current_rank_context().device
    _require_cuda(device)
    backend = suite.make_backend()
    reference = {
        name: p.detach().to(device, torch.bfloat16)
        for name, p in suite.make_model().named_parameters()
    }
    frozen = backend.prepare_frozen(suite.make_model())
    passes = ["first", "second"]
    if "offload_parameters" in backend.capabilities.names():
        passes.append("offloaded")
    figures: dict[str, float] = {}
    largest = 0
    for attempt in passes:
        if attempt == "offloaded":
            frozen.offload([ModelPart.PARAMETERS])
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        wrong = []
        for bucket in frozen.full_weights(32 * MIB, gather_dtype=torch.bfloat16):
            largest = max(largest, sum(t.numel() * t.element_size() for _, t in bucket))
            wrong += [n for n, t in bucket if not torch.equal(t.to(torch.bfloat16), reference[n])]
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        after = torch.cuda.memory_allocated(device) - base
        figures |= {f"{attempt}_peak_mib": _mib(peak), f"{attempt}_after_mib": _mib(after)}
        assert not wrong, (
            f"{attempt} pass: {len(wrong)} tensors differ from the unsharded model cast to "
            f"bfloat16, e.g. {wrong[:3]}"
        )
        bound = suite.full_weights_peak_buckets * largest + 4 * MIB
        assert peak <= bound, (
            f"{attempt} pass: the peak above the model is {_mib(peak)} MiB, above "
            f"{suite.full_weights_peak_buckets:g} largest buckets ({_mib(largest)} MiB each) "
            f"+ 4 MiB: the gather holds more than the buckets in flight"
        )
        assert after <= 0.5 * MIB, f"{attempt} pass left {_mib(after)} MiB allocated after it"
    figures["largest_bucket_mib"] = _mib(largest)
    return figures
