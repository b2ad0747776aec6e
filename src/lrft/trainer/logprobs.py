"""Response log-probabilities of a causal LM, computed without full-vocabulary logits.

The model's own forward runs as usual, so whatever the train backend hooks onto it (FSDP2
all-gathers, DeepSpeed ZeRO-3 gathers and releases, their backward hooks) still applies, but its
output head is intercepted for the duration of the call: the head is handed an empty slice of
the hidden states, and its output is replaced by the log-probabilities of the response tokens
only, computed from the gathered head weight a chunk of tokens at a time
(:func:`lrft.algo.logprobs.chunked_token_logprobs`). Prompt and padding positions never reach
the head, and no ``tokens x vocab`` matrix outlives a chunk.

The interception needs a plain ``nn.Linear`` output head whose output the model returns
unchanged as its logits. Models that scale or soft-cap their logits after the head (for example
Gemma 2's ``final_logit_softcapping``) take the plain path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lrft.algo.logprobs import DEFAULT_CHUNK_TOKENS, chunked_token_logprobs
from lrft.trainer.packing import PADDED, LaidOut, TokenLayout
from lrft.trainer.sequences import Sequences, fsdp2_view_outputs_safe

# Config attributes of transformers models that transform the head's output before returning
# it as logits; a model that sets any of them is computed the plain way.
_LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "output_multiplier",
)


def output_head(module: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's output head when its output is returned unchanged as logits, else ``None``.

    ``module`` may be the model itself (also after FSDP2 ``fully_shard``, which keeps its
    methods) or a wrapper holding it as ``.module`` (a DeepSpeed engine).
    """
    model: Any = module
    if not callable(getattr(model, "get_output_embeddings", None)):
        model = getattr(module, "module", None)
        if model is None or not callable(getattr(model, "get_output_embeddings", None)):
            return None
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return None
    config = getattr(model, "config", None)
    for name in _LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            return None
    return head


def plain_response_logprobs(
    module: torch.nn.Module,
    sequences: Sequences,
    *,
    temperature: float,
    device: torch.device,
    layout: TokenLayout = PADDED,
) -> Tensor:
    """(B, T) through the model's full logits: ``log_softmax(logits / T)`` gathered.

    The reference definition; :func:`response_logprobs` equals it.
    """
    laid = layout.lay_out(module, sequences, device)
    with fsdp2_view_outputs_safe():
        logits: Tensor = module(**laid.inputs).logits
    picked = laid.pick(logits, laid.response_index(sequences))
    logprobs = torch.log_softmax(picked.float() / temperature, dim=-1)
    chosen = logprobs.gather(-1, sequences.action_tokens.to(device)[..., None]).squeeze(-1)
    return chosen.masked_fill(~sequences.action_mask.to(device), 0.0)


class _HeadInterception:
    """Forward hooks that turn one head call into response log-probabilities."""

    def __init__(
        self,
        sequences: Sequences,
        laid: LaidOut,
        *,
        temperature: float,
        device: torch.device,
        chunk_tokens: int,
    ) -> None:
        mask = sequences.action_mask
        held, offsets = laid.local(laid.response_index(sequences)[mask])
        # with a split row, this rank scores the response tokens its share of the row predicts
        self._flat_index = offsets[held].to(device)
        self._targets = sequences.action_tokens[mask][held].to(device)
        self._mask = mask.clone()
        self._mask[mask] = held
        self._mask = self._mask.to(device)
        self._temperature = temperature
        self._chunk_tokens = chunk_tokens
        self._hidden: Tensor | None = None

    def before(self, head: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]
        self._hidden = hidden
        # The head still runs (its wrappers' hooks expect a call) on no rows at all.
        return (hidden[..., :0, :], *args[1:])

    def after(self, head: torch.nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
        hidden = self._hidden
        self._hidden = None
        assert hidden is not None, "the head's pre-hook did not run"
        assert isinstance(head, torch.nn.Linear)
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, self._flat_index)
        values = chunked_token_logprobs(
            picked,
            head.weight,
            head.bias,
            self._targets,
            temperature=self._temperature,
            chunk_tokens=self._chunk_tokens,
        )
        result = torch.zeros(self._mask.shape, dtype=values.dtype, device=values.device)
        return result.masked_scatter(self._mask, values)


def response_logprobs(
    module: torch.nn.Module,
    sequences: Sequences,
    *,
    temperature: float,
    device: torch.device,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    layout: TokenLayout = PADDED,
) -> Tensor:
    """(B, T): log-probability of each response token under ``log_softmax(logits / T)``, 0 at
    padding. Equals :func:`plain_response_logprobs` (values and gradients) without its
    full-vocabulary logits; falls back to it for heads that cannot be intercepted. ``layout``:
    padded or packed rows (:mod:`lrft.trainer.packing`).

    Differentiable when grad is enabled. The forward may be collective (FSDP all-gathers, a
    sequence-parallel group's exchanges): every rank calls it equally often.
    """
    head = output_head(module)
    if head is None:
        return plain_response_logprobs(
            module, sequences, temperature=temperature, device=device, layout=layout
        )
    laid = layout.lay_out(module, sequences, device)
    hooks = _HeadInterception(
        sequences, laid, temperature=temperature, device=device, chunk_tokens=chunk_tokens
    )
    # prepend: run before a wrapper's own post-forward hook, which may release the gathered
    # head weight (DeepSpeed ZeRO-3).
    handles = [
        head.register_forward_pre_hook(hooks.before, prepend=True),
        head.register_forward_hook(hooks.after, prepend=True),
    ]
    try:
        with fsdp2_view_outputs_safe():
            result: Tensor = module(**laid.inputs).logits
    finally:
        for handle in handles:
            handle.remove()
    return laid.combine(result)
