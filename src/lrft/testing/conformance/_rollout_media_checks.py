"""Rank-side checks of ``RolloutEngineSuite`` for engines that declare ``images`` or ``audio``.

One set of checks, run per modality (:class:`MediaKind`): the engine serves the suite's tiny
Qwen2-VL (``EngineModels.vlm_dir``) for ``images`` and its tiny Qwen2-Audio
(``EngineModels.audio_dir``) for ``audio``; requests carry media processed by the model's own
processor. The reference is independent of any engine: the plain transformers model of the same
folder, a full forward per token on one unpadded prompt with every media tensor, placing its
tokens itself (Qwen2-VL's 3-D m-RoPE included). An engine that drops the media, places the
tokens after an image by plain 1-D positions, or swaps media between requests gives other
tokens, and the messages say which request and what was expected.
"""

from __future__ import annotations

import torch

from lrft.api import EnginePart
from lrft.testing.conformance._rollout_asserts import (
    assert_close_logprobs,
)
from lrft.testing.conformance._rollout_common import (
    BASE_VERSION,
    EngineModels,
    Suite,
    model_weights,
    rollout_check,
)
from lrft.testing.conformance._rollout_media_common import (
    AUDIO,
    AUDIO_PROMPTS,
    IMAGES,
    MEDIA_PROMPTS,
    MediaKind,
    MediaPrompt,
    assert_media_matches_reference,
    describe,
    greedy_media,
    media_engine,
    media_prompts,
    media_reference,
    reference_media_greedy,
)
from lrft.testing.reference import media_token_logprobs

__all__ = [
    "AUDIO",
    "AUDIO_PROMPTS",
    "IMAGES",
    "MEDIA_PROMPTS",
    "MediaKind",
    "MediaPrompt",
    "assert_media_matches_reference",
    "media_prompts",
    "reference_media_greedy",
]


def _greedy_matches_reference(
    kind: MediaKind, suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = media_engine(kind, suite, models, device)
    folder = kind.folder(models)
    prompts = media_prompts(folder, rank, kind=kind)
    results = greedy_media(engine, prompts, logprobs=True)
    assert_media_matches_reference(results, prompts, folder, device, "one mixed batch")
    model = media_reference(folder, device)
    for prompt, result in zip(prompts, results, strict=True):
        if prompt.processed is None:
            continue
        want = media_token_logprobs(model, prompt.processed, result.output_token_ids)
        assert_close_logprobs(result.logprobs, want, f"{describe(prompt)} logprobs")


def _media_change_the_output(
    kind: MediaKind, suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = media_engine(kind, suite, models, device)
    folder = kind.folder(models)
    first = media_prompts(folder, rank, image_seed=0, kind=kind)
    second = media_prompts(folder, rank, image_seed=1, kind=kind)
    with_media = [index for index, prompt in enumerate(first) if prompt.items]
    wanted = [
        (
            reference_media_greedy(folder, device, first[i]),
            reference_media_greedy(folder, device, second[i]),
        )
        for i in with_media
    ]
    assert any(a != b for a, b in wanted), (
        f"the suite's own {kind.modality} do not change the reference's output: the check "
        "cannot tell an engine that ignores them (a fault of the suite, not of the engine)"
    )
    got_first = greedy_media(engine, [first[i] for i in with_media])
    got_second = greedy_media(engine, [second[i] for i in with_media])
    for index, (a, b), x, y in zip(with_media, wanted, got_first, got_second, strict=True):
        if a == b:
            continue
        if x.output_token_ids == y.output_token_ids == a:
            raise AssertionError(
                f"{describe(first[index])}: asked again with another {kind.noun} (a later "
                f"call, the same prompt ids), the engine gave the first {kind.noun}'s output "
                f"{a} again, where the reference gives {b}: it answered from something cached "
                f"for the earlier call (results or {kind.noun} features kept by prompt ids, "
                f"which are equal for two {kind.noun}s of one size)"
            )
        assert x.output_token_ids != y.output_token_ids, (
            f"{describe(first[index])}: two different {kind.noun}s gave the same output "
            f"{x.output_token_ids}, where the reference gives {a} and {b}: the engine does not "
            f"condition on the {kind.modality}"
        )
        assert (x.output_token_ids, y.output_token_ids) == (a, b), (
            f"{describe(first[index])}: the engine gave {x.output_token_ids} and "
            f"{y.output_token_ids} for the two {kind.noun}s, the reference {a} and {b}"
        )


def _media_batch_independence(
    kind: MediaKind, suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = media_engine(kind, suite, models, device)
    folder = kind.folder(models)
    prompts = media_prompts(folder, rank, kind=kind)
    for prompt in prompts:
        (alone,) = greedy_media(engine, [prompt])
        assert_media_matches_reference([alone], [prompt], folder, device, "alone")
    reverse = prompts[::-1]
    assert_media_matches_reference(
        greedy_media(engine, reverse), reverse, folder, device, "in reverse order"
    )
    doubled = [*prompts, *prompts]
    assert_media_matches_reference(
        greedy_media(engine, doubled), doubled, folder, device, "each twice in one batch"
    )


def _media_outputs_survive_the_lifecycle(
    kind: MediaKind, suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = media_engine(kind, suite, models, device)
    folder = kind.folder(models)
    prompts = media_prompts(folder, rank, kind=kind)
    weights = list(model_weights(folder).items())
    for level in sorted(engine.capabilities.sleep_levels):
        engine.sleep(level)
        engine.wake([EnginePart.WEIGHTS])
        if level == 2:
            engine.load_weights(weights, version=BASE_VERSION + level)
        engine.wake()
        assert_media_matches_reference(
            greedy_media(engine, prompts),
            prompts,
            folder,
            device,
            f"after sleep({level}) and wake{' and a load' if level == 2 else ''}",
        )
    engine.load_weights(weights, version=BASE_VERSION + 10)
    assert_media_matches_reference(
        greedy_media(engine, prompts), prompts, folder, device, "after load_weights"
    )


# --- the checks, per modality ----------------------------------------------------------------


@rollout_check
def check_image_greedy_matches_reference(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Greedy tokens and logprobs of one batch mixing prompts with 0, 1 and 2 images equal the
    reference's, request by request."""
    _greedy_matches_reference(IMAGES, suite, models, rank, device)


@rollout_check
def check_images_change_the_output(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """The same prompts with other images give the reference's other outputs: the images reach
    the model (an engine that ignores them gives one answer for both)."""
    _media_change_the_output(IMAGES, suite, models, rank, device)


@rollout_check
def check_image_batch_independence(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Each image request alone, and the batch in reverse order, give the same greedy tokens as
    the reference: nothing of one request's images leaks into another's."""
    _media_batch_independence(IMAGES, suite, models, rank, device)


@rollout_check
def check_image_outputs_survive_the_lifecycle(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Sleeping at each declared level, waking (and at level 2 loading the weights again) give
    the same image-conditioned outputs."""
    _media_outputs_survive_the_lifecycle(IMAGES, suite, models, rank, device)


@rollout_check
def check_audio_greedy_matches_reference(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Greedy tokens and logprobs of one batch mixing prompts with 0, 1 and 2 audio clips equal
    the reference's, request by request."""
    _greedy_matches_reference(AUDIO, suite, models, rank, device)


@rollout_check
def check_audio_changes_the_output(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """The same prompts with other clips give the reference's other outputs: the audio reaches
    the model."""
    _media_change_the_output(AUDIO, suite, models, rank, device)


@rollout_check
def check_audio_batch_independence(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Each audio request alone, reversed and doubled in one batch, gives the reference's
    greedy tokens: nothing of one request's clips leaks into another's."""
    _media_batch_independence(AUDIO, suite, models, rank, device)


@rollout_check
def check_audio_outputs_survive_the_lifecycle(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Sleep, wake (and a load at level 2) keep the audio-conditioned outputs."""
    _media_outputs_survive_the_lifecycle(AUDIO, suite, models, rank, device)
