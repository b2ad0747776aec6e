"""Rank-side checks of ``RolloutEngineSuite`` on loading weights: what is loaded is what the
engine holds and serves, however it is loaded (``load_weights``, a streaming ``weight_update``,
written in place), a refused batch changes nothing, and a failed update leaves it stale."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lrft.api import (
    FinishReason,
    InPlaceWeightLoader,
    NamedTensors,
    RolloutEngine,
    StaleWeightsError,
    WeightLoadError,
)
from lrft.testing.conformance._rollout_asserts import (
    assert_digests_equal,
    assert_matches_reference,
    first_differing_tensor,
    greedy_outputs,
)
from lrft.testing.conformance._rollout_common import (
    BASE_VERSION,
    EngineModels,
    backdoor_digests,
    model_weights,
    rank_prompts,
    ready_engine,
    reference_digests,
    reference_greedy,
    rollout_check,
    version_of,
)
from lrft.testing.conformance._rollout_weight_checks import generate_raises
from lrft.testing.conformance.expect import raises

if TYPE_CHECKING:
    from lrft.testing.conformance._rollout_common import Suite


def _reference_outputs(
    models: EngineModels, prompts: tuple[tuple[int, ...], ...], device: torch.device
) -> dict[str, list[tuple[tuple[int, ...], FinishReason]]]:
    """The reference greedy outputs of both weight sets, checked to differ (else loading the
    other set would be invisible in the outputs)."""
    outputs = {
        label: [reference_greedy(folder, device, prompt) for prompt in prompts]
        for label, folder in (("base", models.base_dir), ("other", models.other_dir))
    }
    assert outputs["base"] != outputs["other"], (
        f"the two test models decode {prompts} alike ({outputs['base']}): the check would prove "
        "nothing"
    )
    return outputs


@rollout_check
def check_load_other_weights(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    reference = _reference_outputs(models, prompts, device)
    other = model_weights(models.other_dir)
    base = model_weights(models.base_dir)
    alike = sorted(name for name in other if torch.equal(other[name], base[name]))
    assert not alike, f"the test models share {alike}: skipping them in a load would go unseen"
    engine.load_weights(list(other.items()), version=2)
    assert engine.weights_version == 2, f"after load_weights(version=2): {engine.state}"
    wrong = first_differing_tensor(suite.read_engine_weights(engine), other)
    assert wrong is None, f"after load_weights, the engine's {wrong!r} is not the loaded tensor"
    assert_digests_equal(
        engine.weights_digest(),
        reference_digests(models.other_dir, engine),
        "weights_digest() after loading the other weights",
    )
    got = greedy_outputs(engine, prompts)
    assert got != reference["base"], (
        "after load_weights of the other weights, the backdoor and weights_digest() show them, "
        f"but the engine still decodes as the base weights ({got}): it serves weights other than "
        "those it holds"
    )
    assert_matches_reference(got, prompts, models.other_dir, device, "after loading other weights")
    engine.load_weights(list(base.items()), version=3)
    got = greedy_outputs(engine, prompts)
    assert_matches_reference(got, prompts, models.base_dir, device, "after loading back")


def _bad_batches(other: list[tuple[str, torch.Tensor]]) -> dict[str, tuple[str, NamedTensors]]:
    """Batches with one bad tensor each: by the name that must be refused, what is wrong with it
    and the batch."""
    unknown = "model.layers.0.mlp.no_such_weight"
    short_name, short = other[1]
    wide_name, wide = next(
        (name, tensor)
        for name, tensor in other
        if tensor.dim() == 2 and tensor.shape[0] != tensor.shape[1] and name != short_name
    )
    return {
        unknown: ("an unknown name", [*other[:3], (unknown, short), *other[3:]]),
        short_name: (
            "one element short",
            [(n, short.reshape(-1)[:-1] if n == short_name else t) for n, t in other],
        ),
        wide_name: (
            f"transposed to {tuple(wide.t().shape)} (the same number of elements)",
            [(n, wide.t().contiguous() if n == wide_name else t) for n, t in other],
        ),
    }


@rollout_check
def check_bad_batch_changes_nothing(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    before = (engine.state, engine.weights_digest(), backdoor_digests(suite, engine))
    for culprit, (fault, batch) in _bad_batches(
        list(model_weights(models.other_dir).items())
    ).items():
        doing = f"load_weights() of a batch whose {culprit!r} is {fault}"
        with raises(WeightLoadError, doing, match=culprit.replace(".", r"\.")):
            engine.load_weights(batch, version=5)
        assert engine.state == before[0], f"{doing} changed the state to {engine.state}"
        assert_digests_equal(engine.weights_digest(), before[1], f"weights_digest() after {doing}")
        assert_digests_equal(
            backdoor_digests(suite, engine), before[2], f"the backdoor after {doing}"
        )
        doing = doing.replace("load_weights()", "a weight_update block's load")
        with (
            raises(WeightLoadError, doing, match=culprit.replace(".", r"\.")),
            engine.weight_update(6) as load,
        ):
            load(batch)
        assert engine.weights_version is None, f"{doing} left the engine fresh: {engine.state}"
        assert_digests_equal(engine.weights_digest(), before[1], f"weights_digest() after {doing}")
        engine.load_weights(list(model_weights(models.base_dir).items()), version=BASE_VERSION)
    got = greedy_outputs(engine, prompts)
    assert_matches_reference(got, prompts, models.base_dir, device, "after refused batches")


@rollout_check
def check_weight_update_stream(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    other = list(model_weights(models.other_dir).items())
    half = len(other) // 2
    with engine.weight_update(4) as load:
        assert engine.weights_version is None, (
            f"an open update must make the engine stale: {engine.state}"
        )
        generate_raises(engine, prompts, StaleWeightsError)
        load(other[:half])
        load(other[half:])
    assert version_of(engine) == 4, f"after a clean streaming update: {engine.state}"
    assert_matches_reference(
        greedy_outputs(engine, prompts), prompts, models.other_dir, device, "streamed update"
    )
    digest = engine.weights_digest()
    failing = "a weight_update block raising before copying"
    with raises(RuntimeError, failing, match="before copying"), engine.weight_update(5):
        raise RuntimeError("failed before copying")
    assert engine.weights_version is None, f"fresh after a failed update: {engine.state}"
    assert_digests_equal(
        engine.weights_digest(), digest, "weights_digest() after an update that copied nothing"
    )
    base = list(model_weights(models.base_dir).items())
    with raises(RuntimeError, "a weight_update block raising after copying", match="after copying"):
        _fail_after_copying(engine, base[:half], version=6)
    assert version_of(engine) is None, f"fresh after a failed partial update: {engine.state}"
    generate_raises(engine, prompts, StaleWeightsError)
    engine.load_weights(base[half:], version=7)
    assert engine.weights_version is None, (
        f"a partial update after a failed one left a mix of versions labelled fresh: {engine.state}"
    )
    engine.load_weights(base, version=8)
    assert version_of(engine) == 8, f"after a complete load_weights(version=8): {engine.state}"
    assert_matches_reference(
        greedy_outputs(engine, prompts), prompts, models.base_dir, device, "recovered update"
    )


def _fail_after_copying(engine: RolloutEngine, batch: NamedTensors, *, version: int) -> None:
    with engine.weight_update(version) as load:
        load(batch)
        raise RuntimeError("failed after copying")


@rollout_check
def check_outputs_follow_every_load(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """The same prompts decoded before and after each way of loading: nothing computed from the
    old weights (results, a prefix cache) survives an update."""
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    reference = _reference_outputs(models, prompts, device)
    folders = {"base": models.base_dir, "other": models.other_dir}
    held = "base"

    def decodes_as(label: str, how: str) -> None:
        got = greedy_outputs(engine, prompts)
        if label != held:
            assert got != reference[held], (
                f"after {how}, the engine still decodes as the {held} weights it held before "
                f"({got}): results or a cache of the old weights outlived the update"
            )
        assert_matches_reference(got, prompts, folders[label], device, f"after {how}")

    decodes_as("base", "set-up")
    weights = {label: list(model_weights(folder).items()) for label, folder in folders.items()}
    with engine.weight_update(2) as load:
        half = len(weights["other"]) // 2
        load(weights["other"][:half])
        load(weights["other"][half:])
    decodes_as("other", "a weight_update block loading the other weights")
    held = "other"
    if "loads_in_place" in engine.capabilities.names():
        _write_in_place(engine, weights["base"], version=3)
        decodes_as("base", "writing the base weights in place")
        held = "base"
    last = "other" if held == "base" else "base"
    engine.load_weights(weights[last], version=4)
    decodes_as(last, f"load_weights of the {last} weights")


def _write_in_place(engine: RolloutEngine, weights: NamedTensors, *, version: int) -> None:
    with engine.weight_update(version) as load:
        assert isinstance(load, InPlaceWeightLoader), (
            f"{engine.name} declares loads_in_place but weight_update yields {type(load).__name__}"
        )
        targets = load.targets([name for name, _ in weights])
        for target, (_, tensor) in zip(targets, weights, strict=True):
            target.copy_(tensor)


# Last: it builds an engine of its own (the tied model), and an engine that allows one instance
# per process then has to rebuild the suite's cached one for any later check.
@rollout_check(last=True)
def check_load_tied_weights(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """An engine serving a model with tied input and output embeddings, loaded with other tied
    weights, decodes as they do: the output embedding follows the input one (an engine that
    computes logits from a copy of the weights it was built with serves a mix)."""
    prompts = rank_prompts(rank)
    with suite.make_engine(models.tied_base_dir, device) as engine:
        got = greedy_outputs(engine, prompts)
        assert_matches_reference(got, prompts, models.tied_base_dir, device, "tied, as built")
        other = list(model_weights(models.tied_other_dir).items())
        engine.load_weights(other, version=2)
        assert version_of(engine) == 2, f"after load_weights(version=2): {engine.state}"
        assert_digests_equal(
            engine.weights_digest(),
            reference_digests(models.tied_other_dir, engine),
            "weights_digest() after loading other tied weights",
        )
        got = greedy_outputs(engine, prompts)
        assert_matches_reference(
            got, prompts, models.tied_other_dir, device, "tied embeddings, after load_weights"
        )
