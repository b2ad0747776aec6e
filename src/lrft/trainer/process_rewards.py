"""Process rewards in the trainer: a process reward model (``--prm_pretrain``) scores each
step's end (``--prm_step_separator``, :mod:`lrft.rewards.process`), and those scores become
token rewards there, with the outcome reward (the task reward, shaped) on each response's last
token. The advantages then read token rewards, as they do for a multi-turn episode's turns:
outcome estimators (GRPO) compare the responses' sums, discounted ones (REINFORCE, GAE) credit
each step where it ends.

The model is wrapped by the train backend like a reward model (sharded, and with
``--enable_engine_sleep`` its parameters on the host outside its phase, ``process_rewards``).
Its forward may be collective, so every rank runs the same number of micro-batch forwards,
padding with a copy of a row it holds. With ``--packing_samples`` each forward's rows are packed
into one row, as a reward model's are (each rank's own rows, never split over a sequence-parallel
group). In a split placement the trainer ranks hold it and score each batch as it arrives.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

import attrs
import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lrft.api.errors import ConfigError
from lrft.api.protocols import FrozenModel, TrainBackend
from lrft.api.types import ModelPart
from lrft.config import TrainConfig
from lrft.config.inputs import check_model_folder
from lrft.dist import max_over_ranks
from lrft.distill.tokenizers import check_same_tokenizer
from lrft.models.packed_attention import use_packed_attention
from lrft.rewards.process import Decode, place_step_rewards, step_ends, step_probabilities
from lrft.trainer.colocation import Colocation
from lrft.trainer.packing import PADDED, TokenLayout
from lrft.trainer.rewards import load_every_weight
from lrft.trainer.sequences import Sequences

PRM_RULE = (
    "a process reward model is a *ForTokenClassification folder with 1 or 2 labels (lrft "
    "train-rm --step_separator trains and exports one)"
)


def _labels(model_config: dict[str, object]) -> int:
    id2label = model_config.get("id2label")
    if isinstance(id2label, dict):
        return len(id2label)
    value = model_config.get("num_labels", 2)
    return int(value) if isinstance(value, int) else 2


def check_process_reward_model(config: TrainConfig) -> None:
    """``prm_pretrain`` is a token-classification folder of 1 or 2 labels sharing the student's
    tokenizer; raises ``ConfigError`` naming the flag and the path."""
    path = config.prm_pretrain
    if path is None:
        return
    assert config.pretrain is not None
    check_model_folder("prm_pretrain", path, tokenizer=True)
    model_config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    architectures = model_config.get("architectures") or []
    if architectures and not any(str(a).endswith("ForTokenClassification") for a in architectures):
        raise ConfigError(f"prm_pretrain {path!r} is a {architectures[0]} folder: {PRM_RULE}")
    if _labels(model_config) not in (1, 2):
        raise ConfigError(f"prm_pretrain {path!r} has {_labels(model_config)} labels: {PRM_RULE}")
    check_same_tokenizer(config.pretrain, path, flag="prm_pretrain")


def load_process_reward_model(path: str, backend: TrainBackend, *, packed: bool) -> FrozenModel:
    """The process reward model in folder ``path``, in fp32 (routed through packed attention
    when ``packed``), wrapped by ``backend``. Collective."""
    from transformers import AutoModelForTokenClassification

    model = load_every_weight(
        AutoModelForTokenClassification, path, flag="prm_pretrain", rule=PRM_RULE
    )
    if packed:
        use_packed_attention(model)
    return backend.prepare_frozen(model)


@attrs.frozen(kw_only=True, eq=False)
class ProcessRewards:
    """Token rewards from a process reward model's step scores (see the module docstring).
    ``offload``: the parameters are reloaded for each call and offloaded after it."""

    model: FrozenModel
    separator: str
    decode: Decode
    special_ids: Collection[int]
    micro_batch_size: int
    device: torch.device
    offload: bool
    layout: TokenLayout = PADDED
    """Padded rows, or each forward's rows packed into one (``packing_samples``; never split
    over a sequence-parallel group: each rank scores its own rows, as reward models do)."""

    def token_rewards(
        self, sequences: Sequences, outcome: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        """(B, T): each step's score on its last token plus ``outcome`` (B,) on each response's
        last token, and the steps' metrics. Collective over the default group."""
        lengths = sequences.action_mask.sum(-1).tolist()
        ends = [
            step_ends(
                sequences.action_tokens[row, :length].tolist(),
                self.separator,
                self.decode,
                self.special_ids,
            )
            for row, length in enumerate(lengths)
        ]
        if self.offload:
            self.model.reload([ModelPart.PARAMETERS])
        try:
            scores = self._scores(sequences, ends)
        finally:
            if self.offload:
                self.model.offload([ModelPart.PARAMETERS])
        rewards = place_step_rewards(ends, scores, width=sequences.action_mask.shape[1])
        rows = torch.arange(len(lengths))
        rewards[rows, torch.tensor(lengths) - 1] += outcome.float()
        flat = [value for row in scores for value in row]
        metrics = {
            "process/steps": sum(map(len, ends)) / max(len(ends), 1),
            "process/step_score": sum(flat) / len(flat) if flat else float("nan"),
        }
        return rewards, metrics

    def _scores(self, sequences: Sequences, ends: list[list[int]]) -> list[list[float]]:
        size = self.micro_batch_size
        chunks = [
            torch.arange(start, min(start + size, len(sequences)))
            for start in range(0, len(sequences), size)
        ]
        scores: list[list[float]] = []
        for index in range(max_over_ranks(len(chunks), self.device)):
            if index >= len(chunks):
                # fewer rows than another rank: a forward of padding keeps the collectives alike
                self._forward(_padding(sequences))
                continue
            rows = chunks[index].tolist()
            probabilities, starts = self._forward(sequences.select(chunks[index]))
            for offset, row in enumerate(rows):
                first = int(starts[offset]) + int(sequences.prompt_lengths[row])
                scores.append(probabilities[[first + t for t in ends[row]]].tolist())
        return scores

    def _forward(self, chunk: Sequences) -> tuple[Tensor, Tensor]:
        """Each token's step score (the head's output read as a probability), flattened over
        the forward's rows, and where each row's first token is in it."""
        module = self.model.module
        laid = self.layout.lay_out(module, chunk, self.device)
        with torch.no_grad():
            logits = module(**laid.inputs).logits
        return step_probabilities(logits).reshape(-1).cpu(), laid.starts


def _padding(sequences: Sequences) -> Sequences:
    """One row to run when this rank has none left: one of its own, or a one-token row."""
    if len(sequences):
        return sequences.select(torch.zeros(1, dtype=torch.long))
    one = torch.ones((1, 1), dtype=torch.long)
    return Sequences(
        input_ids=one,
        attention_mask=one,
        prompt_lengths=torch.zeros(1, dtype=torch.long),
        action_mask=one.bool(),
        action_tokens=one,
    )


def process_token_rewards(
    colocation: Colocation, process: ProcessRewards | None, sequences: Sequences, outcome: Tensor
) -> tuple[Tensor | None, dict[str, float]]:
    """With a process reward model, in the ``process_rewards`` phase: each step's score on its
    last token plus the ``outcome`` (the shaped task reward) on each response's last, and the
    steps' metrics; ``(None, {})`` without one (the outcome alone, on the last token)."""
    if process is None:
        return None, {}
    return colocation.plain("process_rewards", lambda: process.token_rewards(sequences, outcome))


def process_rewards(
    config: TrainConfig, backend: TrainBackend, tokenizer: PreTrainedTokenizerBase
) -> ProcessRewards | None:
    """The run's process rewards (``None`` without ``prm_pretrain``). Collective."""
    if config.prm_pretrain is None:
        return None
    assert config.prm_step_separator is not None
    model = load_process_reward_model(config.prm_pretrain, backend, packed=config.packing_samples)
    offload = config.enable_engine_sleep and ModelPart.PARAMETERS in backend.capabilities.offload
    if offload:
        model.offload([ModelPart.PARAMETERS])
    return ProcessRewards(
        model=model,
        separator=config.prm_step_separator,
        decode=lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=False)),
        special_ids=frozenset(int(i) for i in tokenizer.all_special_ids),
        micro_batch_size=config.micro_rollout_batch_size,
        device=backend.device,
        offload=offload,
        layout=TokenLayout(packed=True) if config.packing_samples else PADDED,
    )
