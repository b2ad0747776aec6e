"""Rollouts as padded tensors: ``prompt + response`` token ids, right-padded, and where each
response sits in them, with each row's prompt media.

Response-aligned tensors (``B x T``) hold position ``t`` of the ``t``-th generated token. Right
padding keeps each real token's position id equal to its index, so a text model takes no
position ids; a row's media (its prompt's :class:`~lrft.api.ProcessedMedia`) go into the
forward as the model's own arguments, and an m-RoPE model's 3-D positions are computed by
:func:`lrft.models.media.rope_positions`, the function the ``hf`` engine places its tokens
with (:func:`forward_inputs`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import torch
from torch import Tensor

from lrft.api.media import ProcessedMedia
from lrft.api.types import GenerationResult
from lrft.data import PromptSample
from lrft.models.media import (
    MediaBatch,
    idle_audio_inputs,
    media_modalities,
    media_patches,
    rope_positions,
)


def _media_rows(values: Sequence[ProcessedMedia | None]) -> tuple[ProcessedMedia | None, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True, eq=False)
class Sequences:
    """Padded ``prompt + response`` token ids and where each response sits in them."""

    input_ids: Tensor  # (B, L)
    attention_mask: Tensor  # (B, L)
    prompt_lengths: Tensor  # (B,)
    action_mask: Tensor  # (B, T) bool
    action_tokens: Tensor  # (B, T) the generated ids, 0 where masked
    media: tuple[ProcessedMedia | None, ...] = attrs.field(default=(), converter=_media_rows)
    """Each row's prompt media (``None``: a text prompt); empty when no row has any."""

    # (B,) long: where each response ends, when the action mask has holes in it (the
    # observations of a multi-turn episode, :func:`lrft.trainer.episodes.pack_episodes`);
    # None: a response is its action tokens, the mask's sum
    response_lengths: Tensor | None = None

    def __attrs_post_init__(self) -> None:
        if self.media and len(self.media) != len(self):
            raise ValueError(f"{len(self.media)} media rows for {len(self)} sequences")

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def media_patches(self) -> Tensor:
        """(B,): the rows of each row's media encoder inputs (image patches), 0 for text."""
        return torch.tensor([media_patches(media) for media in self.media] or [0] * len(self))

    def select(self, rows: Tensor) -> Sequences:
        """Rows ``rows``, trimmed to the longest sequence and response among them."""
        mask = self.attention_mask[rows]
        actions = self.action_mask[rows]
        lengths = None if self.response_lengths is None else self.response_lengths[rows]
        width = int(mask.sum(-1).max())
        steps = int((actions.sum(-1) if lengths is None else lengths).max())
        return Sequences(
            input_ids=self.input_ids[rows, :width],
            attention_mask=mask[:, :width],
            prompt_lengths=self.prompt_lengths[rows],
            action_mask=actions[:, :steps],
            action_tokens=self.action_tokens[rows, :steps],
            media=[self.media[i] for i in rows.tolist()] if self.media else (),
            response_lengths=lengths,
        )


def pack(
    results: Sequence[GenerationResult],
    pad_id: int = 0,
    media: Sequence[ProcessedMedia | None] = (),
) -> Sequences:
    """Right-padded tensors of ``results`` (every response has at least one token);
    ``media[i]``: result ``i``'s prompt media (empty: text prompts only)."""
    rows = [list(r.prompt_token_ids) + list(r.output_token_ids) for r in results]
    width = max(len(row) for row in rows)
    steps = max(len(r.output_token_ids) for r in results)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    actions = torch.zeros((len(rows), steps), dtype=torch.long)
    action_mask = torch.zeros((len(rows), steps), dtype=torch.bool)
    for i, (row, result) in enumerate(zip(rows, results, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        n = len(result.output_token_ids)
        actions[i, :n] = torch.tensor(result.output_token_ids)
        action_mask[i, :n] = True
    prompt_lengths = torch.tensor([len(r.prompt_token_ids) for r in results])
    return Sequences(
        input_ids=input_ids,
        attention_mask=attention,
        prompt_lengths=prompt_lengths,
        action_mask=action_mask,
        action_tokens=actions,
        media=media if any(m is not None for m in media) else (),
    )


def row_media(prompts: Sequence[PromptSample], n: int) -> list[ProcessedMedia | None]:
    """The processed media of each of ``n`` rows per prompt, prompt-major."""
    return [
        None if prompt.media is None else prompt.media.processed
        for prompt in prompts
        for _ in range(n)
    ]


FSDP2_VIEW_WARNING = r"FSDP2-wrapped module \(.*\) returned a view tensor"
"""The start of the warning FSDP2 (torch 2.13, ``_fsdp_state._register_pre_backward_hook``)
gives on every forward with grad whose module returns a view among its outputs."""


@contextlib.contextmanager
def fsdp2_view_outputs_safe() -> Iterator[None]:
    """Silence FSDP2's "returned a view tensor" warning around a model forward of lrft's.

    An in-place op on such a view would skip FSDP2's pre-backward hook. lrft's forwards read the
    output's logits (or, with the head intercepted, the log-probabilities it returns) and make
    every later tensor out of place (gather, log_softmax, masked_fill, arithmetic), so no
    output is ever written in place: the warning (a Qwen2-VL actor and any token-classification
    critic give it on every rank, every step) says nothing about these calls. Only this message
    is filtered, and only inside the ``with``.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=FSDP2_VIEW_WARNING, category=UserWarning)
        yield


def forward_inputs(
    module: torch.nn.Module, sequences: Sequences, device: torch.device
) -> dict[str, Any]:
    """The keyword arguments of the model's forward over ``sequences``: ids, mask, the rows'
    media and, for an m-RoPE model with media, the 3-D positions the engine decoded with; for an
    audio model over rows without clips, one idle clip that yields no audio token (a sharded
    model's ranks must all run its encoder: :func:`lrft.models.media.idle_audio_inputs`)."""
    input_ids = sequences.input_ids.to(device)
    attention_mask = sequences.attention_mask.to(device)
    inputs: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "use_cache": False,
    }
    if sequences.media:
        width = input_ids.shape[1]
        batch = MediaBatch.build(
            sequences.media, offsets=[0] * len(sequences), width=width, device=device
        )
        inputs.update(batch.kwargs)
        rope = rope_positions(module, input_ids, attention_mask, batch)
        if rope is not None:
            inputs["position_ids"] = rope[0]
    if "input_features" not in inputs and "audio" in media_modalities(module):
        # every rank runs the audio encoder, with or without clips (see idle_audio_inputs)
        inputs.update(idle_audio_inputs(module, device))
    return inputs


def response_positions(sequences: Sequences) -> Tensor:
    """(B, T): the position whose logits predict each response token (prompt length + t - 1)."""
    steps = sequences.action_mask.shape[1]
    offsets = torch.arange(steps)
    width = sequences.input_ids.shape[1]
    return (sequences.prompt_lengths[:, None] - 1 + offsets[None, :]).clamp(max=width - 1)
