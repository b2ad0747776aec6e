"""The checks of ``SplitWeightSyncSuite`` around generation and the model's other towers: no
weight is written into an engine while a generation runs on it (``serving``), and a
vision-language model's vision tower travels with the rest of its weights."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch

from lrft.api import (
    GenerationRequest,
    GenerationResult,
    OptimizerConfig,
    RolloutEngine,
    SamplingParams,
    WeightLoader,
)
from lrft.api.protocols import NamedTensors
from lrft.testing.conformance._split_sync_checks import (
    assert_holds,
    handoff,
    reference_weights,
    send,
    split_sync,
    where,
)
from lrft.testing.conformance._sync_checks import NEW_TOKENS, PROMPTS, trained_source
from lrft.testing.conformance._sync_hooks import WeightSyncHooks
from lrft.testing.conformance._sync_proxies import LoaderProxy
from lrft.testing.distributed import current_rank_context, current_split_groups
from lrft.testing.reference import greedy_continuation, load_reference_model

Suite = type[WeightSyncHooks[Any]]

HOLD_S = 1.0
"""How long a generation runs before it reads the weights: long enough for a sync that does
not wait for it to write some of them."""


class SlowGeneration(LoaderProxy):
    """An engine whose ``generate`` first lingers for :data:`HOLD_S`, and which counts the
    batches of weights loaded while a generation runs (``loads_during_generation``)."""

    def __init__(self, engine: RolloutEngine) -> None:
        super().__init__(engine)
        self.started = threading.Event()
        self.running = False
        self.loads_during_generation = 0

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        self.running = True
        self.started.set()
        try:
            time.sleep(HOLD_S)
            return self._engine.generate(requests, params)
        finally:
            self.running = False

    def wrap(self, load: WeightLoader) -> WeightLoader:
        def counted(named_tensors: NamedTensors) -> None:
            if self.running:
                self.loads_during_generation += 1
            load(named_tensors)

        return counted


def check_split_generation_excludes_sync(suite: Suite, model_dir: Path) -> None:
    """A rollout rank generates in a thread of its own, inside ``serving``, while the sync
    arrives: the sync must write nothing until the generation ends, which reads the old
    weights only; then the engine holds the new ones."""
    groups = current_split_groups()
    if groups.role == "train":
        source = trained_source(suite, steps=1)
        send(suite, source, reference_weights(suite, source), version=9)
        return
    device = current_rank_context().device
    with suite.make_engine(model_dir, torch.float32, device) as engine:
        before = engine.weights_digest()
        slow = SlowGeneration(engine)
        sync = split_sync(suite, 3 * 1024)
        requests = [
            GenerationRequest(prompt_token_ids=p, request_id=str(i)) for i, p in enumerate(PROMPTS)
        ]
        params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
        outcome: dict[str, Any] = {}

        def generate() -> None:
            try:
                with sync.serving(engine):
                    outcome["results"] = slow.generate(requests, params)
            except BaseException as error:  # reported below, after the sync's own checks
                outcome["error"] = error

        thread = threading.Thread(target=generate, name="split-sync-generation")
        thread.start()
        slow.started.wait()
        sync.sync(None, cast(RolloutEngine, slow), version=9)
        thread.join()
        assert slow.loads_during_generation == 0, (
            f"{where()}: the sync loaded {slow.loads_during_generation} batch(es) of weights "
            "into the engine while a generation was running on it (inside serving()): that "
            "generation read half-written weights"
        )
        if "error" in outcome:
            raise AssertionError(f"{where()}: the generation inside serving() failed") from outcome[
                "error"
            ]
        reference = load_reference_model(model_dir)
        want = [tuple(greedy_continuation(reference, p, NEW_TOKENS)) for p in PROMPTS]
        got = [r.output_token_ids for r in outcome["results"]]
        assert got == want, (
            f"{where()}: the generation that began before the sync gave {got}, not the old "
            f"weights' greedy tokens {want}: it read weights the sync was writing"
        )
        assert engine.weights_version == 9, f"{where()}: engine at {engine.weights_version}, not 9"
        assert_holds(engine, suite, torch.load(handoff(suite, "v9")), before)


def check_split_vision_towers(suite: Suite, vlm_dir: Path) -> None:
    """A tiny Qwen2-VL source (other seed than the engine's) fills a VLM engine: every weight,
    the vision tower's included, ends as the trainer's."""
    from lrft.testing.vision_models import tiny_vlm

    groups = current_split_groups()
    q, kv = suite.model_heads
    if groups.role == "train":
        source = suite.make_train_backend().prepare_trainable(
            tiny_vlm(1, num_attention_heads=q, num_key_value_heads=kv),
            optimizer=OptimizerConfig(lr=1e-3),
        )
        send(suite, source, reference_weights(suite, source), version=2)
        return
    with suite.make_engine(vlm_dir, torch.float32, current_rank_context().device) as engine:
        before = engine.weights_digest()
        split_sync(suite, 64 * 1024).sync(None, engine, version=2)
        expected = torch.load(handoff(suite, "v2"))
        tower = sorted(name for name in expected if "visual" in name)
        assert tower, (
            f"{where()}: the trainer's Qwen2-VL weights name no vision tower: {sorted(expected)[:8]}"
        )
        assert_holds(engine, suite, expected, before)
        held = engine.weights_digest()
        changed = [name for name in tower if held[name] != before[name]]
        assert changed, f"{where()}: no vision-tower weight changed in the engine: {tower[:4]}"
