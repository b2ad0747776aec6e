"""Scalar reward models: a sequence-classification head scores prompt + response.

The reward holds a *handle* to the model, not the module: anything with a ``module`` property,
such as the :class:`~lrft.api.FrozenModel` a train backend returns from ``prepare_frozen``. The
module is looked up at every call, so the trainer's colocation can offload the model between
phases and reload it before scoring (the reward never keeps a reference to parameters that may
move). A bare ``torch.nn.Module`` works too, for a model that stays put.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import torch

from lrft.api.errors import ConfigError
from lrft.api.validators import non_negative, optional, positive_int, positive_number
from lrft.models.packed_attention import ROWS_KWARG, PackedRows
from lrft.rewards._checks import name_validator
from lrft.rewards.base import RewardError, RewardOutput, RewardSample


class ModuleHandle(Protocol):
    """What the reward needs of a colocated model (a ``FrozenModel`` satisfies it)."""

    @property
    def module(self) -> torch.nn.Module: ...


class TextTokenizer(Protocol):
    """The one tokenizer call the reward makes (Hugging Face tokenizers satisfy it)."""

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...


def prompt_then_response(sample: RewardSample) -> str:
    """The default text to score: the prompt (already templated) followed by the response."""
    return sample.prompt + sample.response


@attrs.frozen(kw_only=True, eq=False)
class SequenceClassifierReward:
    """The ``label_index``-th logit of a ``*ForSequenceClassification`` model as the score.

    Each sample's ``text(sample)`` is tokenised (with the tokenizer's special tokens unless
    ``add_special_tokens=False``), right-padded with the model's ``config.pad_token_id`` into
    micro-batches of ``micro_batch_size``, and passed through the model under ``no_grad``. Hugging
    Face heads read the last token that is not padding, so a sample scores the same as alone and
    unpadded; padding is why the config needs a pad id once a micro-batch holds two samples.

    Right padding matters: a left-padded causal model would see shifted positions. A text longer
    than ``max_length`` tokens keeps its last ``max_length`` (the end of the response, which the
    score reads) and the metric ``truncated`` is 1 for it. The module should be in eval mode (as
    frozen models from a backend and ``from_pretrained`` models are).

    With a sharded model the forward is collective: every rank must call this with the same
    number of micro-batches (the trainer pads the batches it shards, as for any collective).

    ``packed``: each micro-batch is one row of its samples end to end, without padding
    (``lrft.models.packed_attention``; the model must be set up for it with
    ``use_packed_attention``), and each sample's score is its head's output at its own last
    token, read from the head itself (``score``) rather than from the model's pooling.
    """

    model: torch.nn.Module | ModuleHandle
    tokenizer: TextTokenizer
    text: Callable[[RewardSample], str] = prompt_then_response
    add_special_tokens: bool = True
    max_length: int | None = attrs.field(default=None, validator=optional(positive_int))
    micro_batch_size: int = attrs.field(default=8, validator=positive_number)
    label_index: int = attrs.field(default=0, validator=non_negative)
    name: str = attrs.field(default="reward_model", validator=name_validator)
    packed: bool = False

    def module(self) -> torch.nn.Module:
        """The module to run now (looked up through the handle at every call)."""
        if isinstance(self.model, torch.nn.Module):
            return self.model
        return self.model.module

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        token_ids: list[list[int]] = []
        truncated: list[float] = []
        for index, sample in enumerate(samples):
            try:
                ids = self._tokens(sample)
            except Exception as error:
                raise RewardError(
                    reward=self.name,
                    sample_index=index,
                    detail=f"tokenising raised {type(error).__name__}: {error}",
                ) from error
            too_long = self.max_length is not None and len(ids) > self.max_length
            if self.max_length is not None and too_long:
                ids = ids[-self.max_length :]
            token_ids.append(ids)
            truncated.append(float(too_long))
        module = self.module()
        self._check_pad_id(module, len(token_ids))
        scores: list[torch.Tensor] = []
        for start in range(0, len(token_ids), self.micro_batch_size):
            batch = token_ids[start : start + self.micro_batch_size]
            try:
                scores.append(self._forward(module, batch))
            except Exception as error:
                # Raised as a RewardError so that compute_rewards does not re-run samples one by
                # one to find a culprit: with a sharded model the forward is collective, and a
                # re-run on one rank alone would hang the others.
                raise RewardError(
                    reward=self.name,
                    detail=f"the forward of samples {start}..{start + len(batch) - 1} raised "
                    f"{type(error).__name__}: {error}",
                ) from error
        all_scores = torch.cat(scores) if scores else torch.zeros(0)
        return RewardOutput(scores=all_scores, metrics={"truncated": truncated})

    def _tokens(self, sample: RewardSample) -> list[int]:
        text = self.text(sample)
        ids = list(self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens))
        if not ids:
            raise ValueError(f"the text to score tokenises to no tokens: {text!r}")
        return ids

    def _check_pad_id(self, module: torch.nn.Module, samples: int) -> None:
        pad_id = getattr(getattr(module, "config", None), "pad_token_id", None)
        if pad_id is None and min(samples, self.micro_batch_size) > 1 and not self.packed:
            raise ConfigError(
                f"{self.name}: the model's config.pad_token_id is None, but micro-batches of "
                f"{self.micro_batch_size} samples need padding; set config.pad_token_id (or "
                "micro_batch_size=1)"
            )

    def _forward(self, module: torch.nn.Module, batch: list[list[int]]) -> torch.Tensor:
        if self.packed:
            return self._packed_forward(module, batch)
        pad_id = getattr(getattr(module, "config", None), "pad_token_id", None)
        device = next(module.parameters()).device
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), pad_id or 0, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        with torch.no_grad():
            output = module(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)
            )
        logits: torch.Tensor = output.logits if hasattr(output, "logits") else output[0]
        if logits.dim() != 2 or not 0 <= self.label_index < logits.shape[1]:
            raise ValueError(
                f"expected logits of shape (batch, num_labels > label_index={self.label_index}) "
                f"from a sequence-classification head, got {tuple(logits.shape)}"
            )
        return logits[:, self.label_index].detach().to("cpu", torch.float32)

    def _packed_forward(self, module: torch.nn.Module, batch: list[list[int]]) -> torch.Tensor:
        device = next(module.parameters()).device
        lengths = [len(ids) for ids in batch]
        input_ids = torch.tensor([token for ids in batch for token in ids], dtype=torch.long)
        positions = torch.cat([torch.arange(length) for length in lengths])
        head = _score_head(module)
        captured: list[torch.Tensor] = []
        handle = head.register_forward_hook(lambda _m, _a, output: captured.append(output))
        try:
            with torch.no_grad():
                module(
                    input_ids=input_ids[None].to(device),
                    position_ids=positions[None].to(device),
                    **{ROWS_KWARG: PackedRows.of_lengths(lengths, device)},
                )
        finally:
            handle.remove()
        per_token = captured[-1][0]  # (tokens, num_labels)
        if not 0 <= self.label_index < per_token.shape[-1]:
            raise ValueError(
                f"label_index {self.label_index} is outside the head's {per_token.shape[-1]} "
                "outputs"
            )
        ends = torch.tensor(lengths).cumsum(0) - 1
        return per_token[ends.to(per_token.device), self.label_index].to("cpu", torch.float32)


def _score_head(module: torch.nn.Module) -> torch.nn.Module:
    """The per-token head of a sequence-classification model (``score``; a DeepSpeed engine
    holds the model as ``module``)."""
    for owner in (module, getattr(module, "module", None)):
        head = getattr(owner, "score", None)
        if isinstance(head, torch.nn.Module):
            return head
    raise ValueError(
        f"{type(module).__name__} has no 'score' head to read per-token scores from: a packed "
        "reward model needs a transformers sequence-classification model"
    )
