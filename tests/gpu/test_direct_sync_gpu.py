"""The direct sync's in-place path on CUDA, where each bucket goes through the copy kernels and,
from its second sync on, replays them from a CUDA graph: one DirectSync, synced again and again
with new values, across sleeps that move or drop the engine's storage, always leaves torch's
casts of what was sent and reports their combined digest (the plans made for the storage's
old addresses are retired when it moves).

Skipped with a reason where CUDA is missing (CI has none).
"""

from __future__ import annotations

import pytest
import torch

from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync import DirectSync
from lrft.testing.models import tiny_causal_lm
from tests.unit.test_direct_sync_paths import _Weights, sync_and_check

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEVICE = torch.device("cuda", 0)


def test_repeated_in_place_syncs_on_cuda_follow_values_and_moved_storage() -> None:
    trained = tiny_causal_lm(3)
    source = _Weights({n: p.detach().clone().to(DEVICE) for n, p in trained.named_parameters()})
    config = HFEngineConfig(dtype=torch.bfloat16, device=DEVICE)
    engine = HFRolloutEngine(tiny_causal_lm(0), config=config)
    engine_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    sync = DirectSync(bucket_bytes=4 * 1024)
    for step, sleep in enumerate([None, None, None, 1, None, 2, None, None], start=1):
        if sleep is not None:
            weight = next(engine.model.parameters())
            address = weight.data_ptr()
            engine.sleep(sleep)  # level 1 parks the weights, level 2 drops them
            # Holding the memory the engine freed makes it wake at new addresses, which the
            # plans written for the old ones must notice.
            held = torch.empty(engine_bytes, dtype=torch.uint8, device=DEVICE)
            engine.wake()
            assert weight.data_ptr() != address
            del held
        for tensor in source.named.values():
            tensor.mul_(-0.5).add_(step)  # new values at the same addresses
        assert sync_and_check(sync, source, engine, step).buckets > 1
    engine.shutdown()
