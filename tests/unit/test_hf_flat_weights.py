"""The hf engine keeps its weights as row-aligned views of one flat buffer.

Checked by pointer arithmetic on the parameters' storage, against an untouched copy of the model
(logits of a fixed input) and against ``tensor_digests`` of the parameters (the plain
digest of ``lrft.api``, computed independently of the buffer). A CPU engine moves nothing at sleep level 1, so
the park/restore copies are also driven directly on ``FlatWeights``, where the host buffer is a
real second buffer at new addresses.
"""

from __future__ import annotations

import copy

import pytest
import torch

from lrft.api import EngineAsleepError
from lrft.api.digest import format_digest, tensor_digests
from lrft.backends.rollout._weight_moves import FlatWeights
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.kernels import ROW_WORDS, DigestBuffer
from lrft.testing.models import random_token_batch, tiny_causal_lm

ROW_BYTES = ROW_WORDS * 4


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # tiny models: one thread is fastest on shared cores


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(random_token_batch(7, 2, 9)).logits
    return logits


def _copies(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _assert_one_row_aligned_buffer(params: dict[str, torch.nn.Parameter]) -> None:
    """Every parameter lies in one storage, each at a row boundary of it, none overlapping, and
    the storage is exactly the parameters' sizes rounded up to whole rows."""
    storages = {p.untyped_storage().data_ptr() for p in params.values()}
    assert len(storages) == 1, f"{len(storages)} storages"
    base = storages.pop()
    size = next(iter(params.values())).untyped_storage().nbytes()
    padded = [-(-p.numel() * p.element_size() // ROW_BYTES) * ROW_BYTES for p in params.values()]
    assert size == sum(padded)
    spans = sorted(
        (p.data_ptr() - base, p.numel() * p.element_size(), name) for name, p in params.items()
    )
    end = 0
    for start, nbytes, name in spans:
        assert start % ROW_BYTES == 0, f"{name} starts {start} bytes in, not on a row"
        assert start >= end, f"{name} overlaps the tensor before it"
        assert params[name].is_contiguous(), name
        end = start + nbytes
    assert end <= size


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_parameters_are_row_aligned_views_of_one_buffer(dtype: torch.dtype | None) -> None:
    model = tiny_causal_lm(0, tie_word_embeddings=True)
    reference = copy.deepcopy(model)
    if dtype is not None:
        torch.nn.Module.to(reference, dtype=dtype)
    originals = dict(model.named_parameters())
    engine = HFRolloutEngine(model, config=HFEngineConfig(device="cpu", dtype=dtype))
    params = dict(engine.model.named_parameters())
    # The Parameter objects stay (the model's modules hold them); only their data moved.
    assert all(params[name] is originals[name] for name in originals)
    assert all(p.untyped_storage().data_ptr() not in _storages(reference) for p in params.values())
    _assert_one_row_aligned_buffer(params)
    assert torch.equal(_logits(engine.model), _logits(reference))


def _storages(model: torch.nn.Module) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in model.parameters()}


def test_weights_digest_is_the_digest_of_the_parameters() -> None:
    model = tiny_causal_lm(3, tie_word_embeddings=True)
    untouched = _copies(model)
    engine = HFRolloutEngine(model, config=HFEngineConfig(device="cpu"))
    digest = engine.weights_digest()
    assert digest == tensor_digests(_copies(engine.model))
    assert digest == tensor_digests(untouched)
    assert "lm_head.weight" not in digest  # a tied weight is listed once, as before


def test_park_and_restore_move_the_whole_buffer_and_keep_the_weights() -> None:
    model = tiny_causal_lm(0, tie_word_embeddings=True)
    reference = copy.deepcopy(model)
    params = dict(model.named_parameters())
    flat = FlatWeights(params, torch.device("cpu"))
    before = flat.sums().clone()
    first = flat.buffer
    flat.park()
    assert flat.parked
    with pytest.raises(RuntimeError, match="not on its device"):
        flat.sums()
    _assert_one_row_aligned_buffer(params)  # the host buffer has the same layout
    parked_at = next(iter(params.values())).untyped_storage().data_ptr()
    assert parked_at != first.views[0].untyped_storage().data_ptr()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(_logits(model), _logits(reference))
    flat.restore()
    _assert_one_row_aligned_buffer(params)
    assert next(iter(params.values())).untyped_storage().data_ptr() != parked_at
    assert torch.equal(flat.sums(), before)
    assert _formatted(params, flat) == tensor_digests(_copies(reference))
    assert torch.equal(_logits(model), _logits(reference))
    with pytest.raises(RuntimeError, match="without park"):
        flat.restore()


def _formatted(params: dict[str, torch.nn.Parameter], flat: FlatWeights) -> dict[str, str]:
    return {
        name: format_digest(p.shape, p.dtype, sums)
        for (name, p), sums in zip(params.items(), flat.sums().tolist(), strict=True)
    }


def test_release_and_allocate_give_a_new_buffer_of_the_same_layout() -> None:
    model = tiny_causal_lm(0)
    params = dict(model.named_parameters())
    shapes = {name: p.shape for name, p in params.items()}
    flat = FlatWeights(params, torch.device("cpu"))
    flat.park()
    flat.release()  # from parked: the host buffer goes too
    assert not flat.parked
    assert all(p.numel() == 0 for p in params.values())
    flat.allocate()
    assert {name: p.shape for name, p in params.items()} == shapes
    _assert_one_row_aligned_buffer(params)


def test_sleep_and_wake_keep_weights_digest_and_ties() -> None:
    model = tiny_causal_lm(0, tie_word_embeddings=True)
    reference = copy.deepcopy(model)
    engine = HFRolloutEngine(model, config=HFEngineConfig(device="cpu"))
    digest = engine.weights_digest()
    engine.sleep(1)
    with pytest.raises(EngineAsleepError):
        engine.weights_digest()
    engine.wake()
    assert engine.weights_digest() == digest
    assert torch.equal(_logits(engine.model), _logits(reference))
    engine.sleep(2)
    engine.wake()
    tied = engine.model
    assert tied.get_parameter("lm_head.weight") is tied.get_parameter("model.embed_tokens.weight")
    _assert_one_row_aligned_buffer(dict(tied.named_parameters()))
    # Loading through the alias writes the one storage both names read.
    other = tiny_causal_lm(5, tie_word_embeddings=True)
    engine.load_weights(list(other.state_dict().items()), version=1)
    assert torch.equal(tied.get_parameter("lm_head.weight"), other.model.embed_tokens.weight)
    assert engine.weights_digest() == tensor_digests(_copies(other))
    assert torch.equal(_logits(tied), _logits(other))


def test_loaded_weights_digest_as_the_loaded_tensors_in_the_engine_dtype() -> None:
    engine = HFRolloutEngine(
        tiny_causal_lm(0), config=HFEngineConfig(device="cpu", dtype=torch.bfloat16)
    )
    other = tiny_causal_lm(2)  # fp32
    engine.load_weights(list(other.state_dict().items()), version=4)
    want = {name: p.detach().to(torch.bfloat16) for name, p in other.named_parameters()}
    assert engine.weights_digest() == tensor_digests(want)
    _assert_one_row_aligned_buffer(dict(engine.model.named_parameters()))


def test_copy_from_and_pinning_check_their_input() -> None:
    buffer = DigestBuffer([((3,), torch.float32), ((2, 2), torch.int8)], "cpu")
    with pytest.raises(ValueError, match=r"first differing spec is at 1: \(\(2, 2\), torch.int8\)"):
        buffer.copy_from(DigestBuffer([((3,), torch.float32), ((4,), torch.int8)], "cpu"))
    with pytest.raises(ValueError, match="at 2: one list ends there"):
        buffer.copy_from(DigestBuffer([*buffer.specs, ((1,), torch.float32)], "cpu"))
    with pytest.raises(ValueError, match="pin_memory needs a host buffer, got device meta"):
        DigestBuffer(buffer.specs, "meta", pin_memory=True)
    source = DigestBuffer(buffer.specs, "cpu")
    source.views[0].copy_(torch.tensor([1.5, -2.0, 3.25]))
    source.views[1].copy_(torch.tensor([[1, -2], [3, 127]], dtype=torch.int8))
    buffer.copy_from(source)
    assert torch.equal(buffer.views[0], source.views[0])
    assert torch.equal(buffer.views[1], source.views[1])
