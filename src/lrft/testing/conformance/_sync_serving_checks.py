"""Rank-side checks of ``WeightSyncSuite`` on what the engine serves after a sync: outputs of an
engine that generated before the sync (nothing computed from the old weights may outlive it),
and vision-language and audio-language sources, whose towers and projectors the trainer
changes between syncs like any other weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import pytest
import torch

from lrft.api import (
    CapabilityNotSupported,
    OptimizerConfig,
    RolloutEngine,
    SamplingParams,
    TrainableModel,
)
from lrft.api.digest import tensor_digests
from lrft.testing.conformance._registry import SYNC_CHECKS
from lrft.testing.conformance._rollout_common import one_thread_on_cpu
from lrft.testing.conformance._rollout_media_common import (
    AUDIO,
    IMAGES,
    MediaKind,
    MediaPrompt,
    describe,
    media_prompts,
)
from lrft.testing.conformance._sync_checks import (
    NEW_TOKENS,
    PROMPTS,
    Suite,
    _assert_digests,
    _engine,
    _expected_digests,
    _gathered,
    _greedy,
    trained_source,
)
from lrft.testing.distributed import current_rank_context
from lrft.testing.reference import (
    greedy_continuation,
    load_reference_model,
    media_greedy_continuation,
    model_with_weights,
)

#: greedy tokens decoded after each sync of a media source (the reference recomputes the media
#: tower for every token)
SERVED_TOKENS = 6


@attrs.frozen(kw_only=True)
class SyncMediaModels:
    """The folders the media check's engines serve: the tiny Qwen2-VL and Qwen2-Audio (seed 0,
    the suite's ``model_heads``), with their processors."""

    vlm_dir: Path
    audio_dir: Path

    def folder(self, kind: MediaKind) -> Path:
        return self.vlm_dir if kind.modality == "images" else self.audio_dir


@SYNC_CHECKS
def check_outputs_follow_a_streamed_sync(suite: Suite, model_dir: Path) -> None:
    """An engine that generated before a sync decodes after it as the trainer's weights: no
    result or prefix cache of the old weights outlives the sync, which loads through the
    streaming ``weight_update`` (an engine may clear its caches on ``load_weights`` only)."""
    with one_thread_on_cpu(current_rank_context().device):
        _outputs_follow_a_streamed_sync(suite, model_dir)


def _outputs_follow_a_streamed_sync(suite: Suite, model_dir: Path) -> None:
    source = trained_source(suite)
    weights = _gathered(source)
    device = current_rank_context().device
    initial = load_reference_model(model_dir, device)
    trained = model_with_weights(model_dir, weights)
    torch.nn.Module.to(trained, device)
    before_want = [tuple(greedy_continuation(initial, p, NEW_TOKENS)) for p in PROMPTS]
    after_want = [tuple(greedy_continuation(trained, p, NEW_TOKENS)) for p in PROMPTS]
    assert after_want != before_want, (
        f"training did not change the reference's greedy tokens {before_want}: the check would "
        "prove nothing (a fault of the suite)"
    )
    with _engine(suite, model_dir, torch.float32) as engine:
        before = _greedy(engine)
        assert before == before_want, (
            f"before any sync, the engine's greedy tokens {before} differ from the reference of "
            f"the folder it serves, {before_want}"
        )
        suite.make_sync(4 * 1024).sync(source, engine, version=3)
        after = _greedy(engine)
        stale = (
            "; they are what it gave before the sync: results or a cache of the old weights "
            "outlived it"
            if after == before
            else ""
        )
        assert after == after_want, (
            f"after a sync into an engine that had generated before it, the engine's greedy "
            f"tokens {after} differ from those of a plain model holding the trainer's weights, "
            f"{after_want}{stale}"
        )


def _tower(kind: MediaKind) -> str:
    return "vision tower" if kind.modality == "images" else "audio tower"


def _media_parts(names: Sequence[str]) -> list[str]:
    """The weights of a media tower and its projector: those outside the language model."""
    return [n for n in names if not n.startswith(("model.language_model.", "lm_head."))]


def _media_kwargs(prompt: MediaPrompt, device: torch.device) -> dict[str, torch.Tensor]:
    assert prompt.processed is not None, f"internal: {describe(prompt)} has no media"
    kwargs = {name: t.to(device) for name, t in prompt.processed.tensors.items()}
    for name, values in prompt.processed.token_tensors.items():
        kwargs[name] = values[None].to(device)
    return kwargs


def _train_with_media(source: TrainableModel, prompt: MediaPrompt) -> None:
    """One optimizer step on the language-model loss of ``prompt`` with its media: the media
    tower and projector get gradients, so the step changes them."""
    device = current_rank_context().device
    ids = torch.tensor([prompt.request.prompt_token_ids], device=device)
    source.module.train()
    loss = source.module(input_ids=ids, labels=ids, **_media_kwargs(prompt, device)).loss
    source.backward(loss)
    report = source.step()
    assert not report.skipped, f"a training step of the media source was skipped: {report}"


def _assert_engine_holds(
    suite: Suite,
    engine: RolloutEngine,
    weights: Mapping[str, torch.Tensor],
    kind: MediaKind,
    what: str,
) -> None:
    expected = _expected_digests(engine, weights)
    towers = set(_media_parts(list(weights)))
    for label, got in (
        ("weights_digest()", engine.weights_digest()),
        ("the backdoor", tensor_digests(suite.read_engine_weights(engine))),
    ):
        differ = sorted(name for name in towers if got.get(name) != expected[name])
        if differ:
            raise AssertionError(
                f"{what}: {label} shows the engine's {_tower(kind)} and its projector are not "
                f"the trainer's: {len(differ)} of their {len(towers)} tensors differ, e.g. "
                f"{differ[:3]}, which training changed since the last sync; a sync that sends "
                f"the language model's weights only leaves the engine's {_tower(kind)} as it was, "
                "and verifying only what it sent cannot see it"
            )
        _assert_digests(got, expected, f"{what}: {label}")


def _assert_serves(
    engine: RolloutEngine,
    folder: Path,
    weights: Mapping[str, torch.Tensor],
    prompt: MediaPrompt,
    what: str,
) -> None:
    model = model_with_weights(folder, weights)
    params = SamplingParams(temperature=0.0, max_new_tokens=SERVED_TOKENS)
    [result] = engine.generate([prompt.request], params)
    want = tuple(
        media_greedy_continuation(
            model, prompt.processed, prompt.request.prompt_token_ids, SERVED_TOKENS
        )
    )
    assert result.output_token_ids == want, (
        f"{what}: {describe(prompt)}: the engine's greedy tokens {result.output_token_ids} "
        f"differ from those of a plain model holding the trainer's weights, {want}"
    )


def _media_source_syncs(suite: Suite, kind: MediaKind, folder: Path) -> str | None:
    """Two rounds of a step with media then a sync; None, or why the engine cannot take part."""
    device = current_rank_context().device
    try:
        engine = suite.make_engine(folder, torch.float32, device)
    except CapabilityNotSupported as refused:
        return f"engine lacks capability {refused.capability}"
    with engine:
        if kind.modality not in engine.capabilities.names():
            return f"{engine.name} engine lacks capability {kind.modality}"
        # the first prompt holds one image or clip: trained on, and decoded after each sync
        prompt = media_prompts(folder, current_rank_context().rank, kind=kind)[0]
        source = suite.make_train_backend().prepare_trainable(
            suite.make_media_source_model(kind.modality), optimizer=OptimizerConfig(lr=1e-2)
        )
        sync = suite.make_sync(16 * 1024)
        previous = _gathered(source)
        for version in (1, 2):
            _train_with_media(source, prompt)
            weights = _gathered(source)
            moved = [
                n for n in _media_parts(list(weights)) if not torch.equal(weights[n], previous[n])
            ]
            assert moved, (
                f"a training step with a {kind.noun} changed none of the source's {kind.noun} "
                "tower and projector weights: the check would prove nothing (a fault of the "
                "suite or of the train backend)"
            )
            what = f"after sync {version} of a {_tower(kind).split()[0]}-language source"
            sync.sync(source, engine, version=version)
            assert engine.weights_version == version, (
                f"{what}: the engine reports version {engine.weights_version}"
            )
            _assert_engine_holds(suite, engine, weights, kind, what)
            _assert_serves(engine, folder, weights, prompt, what)
            previous = weights
    return None


@SYNC_CHECKS.options(fixtures=("media_model_dirs",))
def check_media_towers_follow_each_sync(suite: Suite, media: SyncMediaModels) -> None:
    """A vision-language source (the tiny Qwen2-VL) and an audio-language one (the tiny
    Qwen2-Audio), each trained with its media between two syncs: after each sync the engine's
    digest and backdoor equal the trainer's weights, the tower and projector included, and it
    decodes prompts with media as a plain model holding them. Skipped for an engine that serves
    neither modality."""
    with one_thread_on_cpu(current_rank_context().device):
        lacking = [
            why
            for kind in (IMAGES, AUDIO)
            if (why := _media_source_syncs(suite, kind, media.folder(kind))) is not None
        ]
    if len(lacking) == 2:
        pytest.skip("; ".join(lacking))
