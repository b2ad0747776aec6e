"""Experience: rollouts turned into padded tensors, logprobs, rewards and advantages.

One :class:`ExperienceMaker` pass per role (engine, actor, reference, reward), each micro-batched.
Sequences are ``prompt + response``, right-padded; response-aligned tensors (``B x T``) hold
position ``t`` of the ``t``-th generated token. Right padding keeps each real token's position
id equal to its index, so no position ids are passed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import torch
import torch.distributed as dist
from torch import Tensor

from lrft.algo import (
    AdvantageParams,
    RewardBatch,
    RunningMoments,
    compute_advantages,
    kl_penalized_rewards,
    token_kl,
)
from lrft.api.protocols import FrozenModel, RolloutEngine
from lrft.api.types import GenerationRequest, GenerationResult, SamplingParams
from lrft.data import PromptSample
from lrft.dist import all_gather_objects, tp_group_generate
from lrft.rewards import RewardError, RewardFn, RewardSample, compute_rewards

Decode = Callable[[Sequence[int]], str]


@attrs.frozen(kw_only=True, eq=False)
class Sequences:
    """Padded ``prompt + response`` token ids and where each response sits in them."""

    input_ids: Tensor  # (B, L)
    attention_mask: Tensor  # (B, L)
    prompt_lengths: Tensor  # (B,)
    action_mask: Tensor  # (B, T) bool
    action_tokens: Tensor  # (B, T) the generated ids, 0 where masked

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, rows: Tensor) -> Sequences:
        """Rows ``rows``, trimmed to the longest sequence and response among them."""
        mask = self.attention_mask[rows]
        actions = self.action_mask[rows]
        width = int(mask.sum(-1).max())
        steps = int(actions.sum(-1).max())
        return Sequences(
            input_ids=self.input_ids[rows, :width],
            attention_mask=mask[:, :width],
            prompt_lengths=self.prompt_lengths[rows],
            action_mask=actions[:, :steps],
            action_tokens=self.action_tokens[rows, :steps],
        )


def pack(results: Sequence[GenerationResult], pad_id: int = 0) -> Sequences:
    """Right-padded tensors of ``results`` (every response has at least one token)."""
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
    )


def response_logprobs(
    module: torch.nn.Module, sequences: Sequences, *, temperature: float, device: torch.device
) -> Tensor:
    """(B, T): log-probability of each generated token under ``log_softmax(logits / T)``.

    The same definition as the engine's returned logprobs; differentiable when grad is enabled.
    The forward may be collective (FSDP all-gathers): every rank calls it equally often.
    """
    logits: Tensor = module(
        input_ids=sequences.input_ids.to(device),
        attention_mask=sequences.attention_mask.to(device),
    ).logits
    steps = sequences.action_mask.shape[1]
    # Token t of the response is predicted by the logits at position prompt_length + t - 1.
    offsets = torch.arange(steps)
    positions = (sequences.prompt_lengths[:, None] - 1 + offsets[None, :]).clamp(
        max=logits.shape[1] - 1
    )
    picked = logits.gather(1, positions.to(device)[..., None].expand(-1, -1, logits.shape[-1]))
    logprobs = torch.log_softmax(picked.float() / temperature, dim=-1)
    chosen = logprobs.gather(-1, sequences.action_tokens.to(device)[..., None]).squeeze(-1)
    return chosen.masked_fill(~sequences.action_mask.to(device), 0.0)


@attrs.frozen(kw_only=True, eq=False)
class ExperienceBatch:
    """One rank's experience of one iteration, on the CPU; rows are prompt-major groups."""

    sequences: Sequences
    old_logprobs: Tensor  # (B, T)
    ref_logprobs: Tensor | None  # (B, T)
    scores: Tensor  # (B,) the reward function's scores
    advantages: Tensor  # (B, T)
    metrics: dict[str, float] = attrs.field(factory=dict)

    def __len__(self) -> int:
        return len(self.sequences)

    def select(self, rows: Tensor) -> ExperienceBatch:
        picked = self.sequences.select(rows)
        steps = picked.action_mask.shape[1]
        ref = None if self.ref_logprobs is None else self.ref_logprobs[rows, :steps]
        return ExperienceBatch(
            sequences=picked,
            old_logprobs=self.old_logprobs[rows, :steps],
            ref_logprobs=ref,
            scores=self.scores[rows],
            advantages=self.advantages[rows, :steps],
        )


def all_gather_moments(moments: RunningMoments) -> RunningMoments:
    """Statistics over every rank of the default group (exact merge, same order everywhere)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return moments
    return RunningMoments.merge_all(all_gather_objects(moments))


@attrs.define(kw_only=True)
class ExperienceMaker:
    """Generate, score and evaluate one rank's prompts; see the module docstring.

    ``tp_group`` is this rank's engine TP group (``None`` for TP 1). ``reward_moments`` are the
    running reward statistics (DP-global), updated only by :meth:`make` when
    ``normalize_reward`` is on.
    """

    engine: RolloutEngine
    decode: Decode
    reward: RewardFn
    sampling: SamplingParams
    estimator: str
    micro_batch_size: int
    device: torch.device
    tp_group: dist.ProcessGroup | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: bool = True
    normalize_reward: bool = False
    reward_moments: RunningMoments = attrs.field(factory=RunningMoments)
    advantage_params: AdvantageParams = attrs.field(factory=AdvantageParams)

    def generate(
        self, prompts: Sequence[PromptSample], params: SamplingParams
    ) -> list[GenerationResult]:
        requests = [
            GenerationRequest(prompt_token_ids=p.prompt_token_ids, request_id=str(p.source_index))
            for p in prompts
        ]
        return tp_group_generate(self.engine.generate, requests, params, self.tp_group)

    def logprobs(self, model: FrozenModel, sequences: Sequences) -> Tensor:
        """Micro-batched, gradient-free :func:`response_logprobs` of ``model``, on the CPU."""
        parts = []
        with torch.no_grad():
            for start in range(0, len(sequences), self.micro_batch_size):
                rows = torch.arange(start, min(start + self.micro_batch_size, len(sequences)))
                chunk = sequences.select(rows)
                values = response_logprobs(
                    model.module, chunk, temperature=self.sampling.temperature, device=self.device
                ).cpu()
                width = sequences.action_mask.shape[1] - values.shape[1]
                parts.append(torch.nn.functional.pad(values, (0, width)))
        return torch.cat(parts)

    def score(
        self, prompts: Sequence[PromptSample], results: Sequence[GenerationResult], n: int
    ) -> tuple[Tensor, dict[str, float]]:
        """The reward of each result (prompt-major, ``n`` per prompt); names a failing sample."""
        samples = []
        for index, result in enumerate(results):
            prompt = prompts[index // n]
            samples.append(
                RewardSample(
                    prompt=prompt.prompt_text,
                    response=self.decode(result.output_token_ids),
                    label="" if prompt.label is None else str(prompt.label),
                    reference=None if prompt.reference is None else str(prompt.reference),
                )
            )
        try:
            output = compute_rewards(self.reward, samples)
        except RewardError as error:
            if error.sample_index is None:
                raise
            prompt = prompts[error.sample_index // n]
            raise RewardError(
                reward=error.reward,
                sample_index=error.sample_index,
                detail=f"{error.detail} [prompt row {prompt.source_index} "
                f"{prompt.prompt_text!r}, response "
                f"{samples[error.sample_index].response!r}]",
            ) from error
        metrics = {f"reward/{name}": _nanmean(values) for name, values in output.metrics.items()}
        return output.scores_tensor(), metrics

    def make(
        self,
        sequences: Sequences,
        scores: Tensor,
        old_logprobs: Tensor,
        ref_logprobs: Tensor | None,
    ) -> ExperienceBatch:
        """Advantages in one normalisation stage, with DP-global whitening statistics."""
        mask = sequences.action_mask
        shaped = scores.double()
        if self.normalize_reward:
            self.reward_moments = self.reward_moments.merge(
                all_gather_moments(RunningMoments.from_values(scores))
            )
            shaped = self.reward_moments.normalize(shaped)
        batch = RewardBatch.from_sequence_rewards(shaped.float(), mask, group_size=self.sampling.n)
        metrics: dict[str, float] = {}
        if ref_logprobs is not None:
            kl = token_kl(old_logprobs, ref_logprobs, mask, self.kl_estimator)
            metrics["kl"] = float(kl.sum() / mask.sum())
            if self.kl_in_reward:
                penalized = kl_penalized_rewards(batch.token_rewards, kl, mask, self.kl_coef)
                batch = RewardBatch.from_token_rewards(penalized, mask, group_size=self.sampling.n)
        advantages = compute_advantages(
            self.estimator, batch, self.advantage_params, reduce_moments=all_gather_moments
        )
        return ExperienceBatch(
            sequences=sequences,
            old_logprobs=old_logprobs,
            ref_logprobs=ref_logprobs,
            scores=scores,
            advantages=advantages.advantages.float(),
            metrics=metrics,
        )


def _nanmean(values: Sequence[float]) -> float:
    finite = [v for v in values if v == v]
    return sum(finite) / len(finite) if finite else float("nan")
