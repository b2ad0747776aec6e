"""Experience: rollouts turned into padded tensors, logprobs, rewards and advantages.

One :class:`ExperienceMaker` pass per role (engine, actor, reference, reward), each micro-batched,
over the padded :class:`lrft.trainer.sequences.Sequences` of the rollout.
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
    fire_temperatures,
    kl_penalized_rewards,
    overlong_penalty,
    scale_logits,
    token_kl,
    with_teacher,
)
from lrft.api.errors import LrftError
from lrft.api.protocols import FrozenModel, RolloutEngine
from lrft.api.types import GenerationRequest, GenerationResult, SamplingParams
from lrft.data import PromptSample
from lrft.dist import all_gather_objects, tp_group_generate
from lrft.rewards import RewardError, RewardFn, RewardOutput, RewardSample, compute_rewards
from lrft.trainer.logprobs import response_logprobs as fused_response_logprobs
from lrft.trainer.packing import PADDED, TokenLayout
from lrft.trainer.passes import gradient_free
from lrft.trainer.sampling import fire_generate
from lrft.trainer.sequences import Sequences, fsdp2_view_outputs_safe

Decode = Callable[[Sequence[int]], str]


def response_logprobs(
    module: torch.nn.Module,
    sequences: Sequences,
    *,
    temperature: float,
    device: torch.device,
    first_token_temperature: float | None = None,
    layout: TokenLayout = PADDED,
) -> Tensor:
    """(B, T): log-probability of each generated token under ``log_softmax(logits / T)``.

    The same definition as the engine's returned logprobs; differentiable when grad is enabled.
    The forward may be collective (FSDP all-gathers): every rank calls it equally often. Computed
    by :func:`lrft.trainer.logprobs.response_logprobs`, without full-vocabulary logits, unless
    ``first_token_temperature`` is set (FIRE sampling): then each response's first token is
    scored at that temperature, through :func:`response_logits`. ``layout``: padded or packed
    rows (:mod:`lrft.trainer.packing`).
    """
    if first_token_temperature is None:
        return fused_response_logprobs(
            module, sequences, temperature=temperature, device=device, layout=layout
        )
    logits = response_logits(
        module,
        sequences,
        temperature=temperature,
        device=device,
        first_token_temperature=first_token_temperature,
        layout=layout,
    )
    return token_logprobs(logits, sequences)


def response_logits(
    module: torch.nn.Module,
    sequences: Sequences,
    *,
    temperature: float,
    device: torch.device,
    first_token_temperature: float | None = None,
    layout: TokenLayout = PADDED,
) -> Tensor:
    """(B, T, V) float32: the logits that predict each response token, divided by the
    temperature it was sampled at (``first_token_temperature`` for the first one under FIRE,
    :func:`lrft.algo.fire_temperatures`).

    The full-vocabulary path, for what needs the whole distribution (the entropy); the
    differentiable forward may be collective, like :func:`response_logprobs`.
    """
    laid = layout.lay_out(module, sequences, device)
    with fsdp2_view_outputs_safe():
        logits: Tensor = module(**laid.inputs).logits
    picked = laid.pick(logits, laid.response_index(sequences)).float()
    if first_token_temperature is None:
        return picked / temperature
    temperatures = fire_temperatures(
        sequences.action_mask.to(device),
        first_token_temperature=first_token_temperature,
        temperature=temperature,
    )
    return scale_logits(picked, temperatures)


def token_logprobs(logits: Tensor, sequences: Sequences) -> Tensor:
    """(B, T): ``log_softmax(logits)`` of each generated token, 0 at padding."""
    logprobs = torch.log_softmax(logits, dim=-1)
    tokens = sequences.action_tokens.to(logits.device)
    chosen = logprobs.gather(-1, tokens[..., None]).squeeze(-1)
    return chosen.masked_fill(~sequences.action_mask.to(logits.device), 0.0)


def pack_engine_logprobs(results: Sequence[GenerationResult], steps: int) -> Tensor:
    """(B, ``steps``): the engine's own logprob of each generated token, 0 at padding."""
    values = torch.zeros((len(results), steps), dtype=torch.float32)
    for row, result in enumerate(results):
        if result.logprobs is None:
            raise ValueError(
                f"result {row} (request {result.request_id!r}) carries no logprobs: sample with "
                "return_logprobs=True"
            )
        values[row, : len(result.logprobs)] = torch.tensor(result.logprobs)
    return values


@attrs.frozen(kw_only=True, eq=False)
class ExperienceBatch:
    """One rank's experience of one iteration, on the CPU; rows are prompt-major groups."""

    sequences: Sequences
    # (B, T); None when the policy update takes them from its own forward (on-policy: one epoch
    # and one optimizer step per iteration, so they equal the current logprobs, detached)
    old_logprobs: Tensor | None
    ref_logprobs: Tensor | None  # (B, T)
    scores: Tensor  # (B,) the reward function's scores
    advantages: Tensor  # (B, T)
    metrics: dict[str, float] = attrs.field(factory=dict)
    values: Tensor | None = None  # (B, T) the critic's, at experience time
    returns: Tensor | None = None  # (B, T) the critic's regression targets
    engine_logprobs: Tensor | None = None  # (B, T) the rollout engine's own, for TIS
    # (B,) the version of the weights that generated each row (split placement), else None
    weight_versions: Tensor | None = None

    def __len__(self) -> int:
        return len(self.sequences)

    def select(self, rows: Tensor) -> ExperienceBatch:
        picked = self.sequences.select(rows)
        steps = picked.action_mask.shape[1]
        ref = None if self.ref_logprobs is None else self.ref_logprobs[rows, :steps]
        return ExperienceBatch(
            sequences=picked,
            old_logprobs=None if self.old_logprobs is None else self.old_logprobs[rows, :steps],
            ref_logprobs=ref,
            scores=self.scores[rows],
            advantages=self.advantages[rows, :steps],
            values=None if self.values is None else self.values[rows, :steps],
            returns=None if self.returns is None else self.returns[rows, :steps],
            engine_logprobs=(
                None if self.engine_logprobs is None else self.engine_logprobs[rows, :steps]
            ),
            weight_versions=None if self.weight_versions is None else self.weight_versions[rows],
        )


def all_gather_moments(moments: RunningMoments) -> RunningMoments:
    """Statistics over every rank of the default group (exact merge, same order everywhere)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return moments
    return RunningMoments.merge_all(all_gather_objects(moments))


@attrs.define(kw_only=True)
class ExperienceMaker:
    """Generate, score and evaluate one rank's prompts; see the module docstring.

    ``tp_group`` is this rank's engine TP group (``None`` for TP 1); it gathers the group's
    prompts only for an engine that cannot span a TP group itself (see :meth:`generate`).
    ``reward_moments`` are the running reward statistics (DP-global), updated only by
    :meth:`make` when ``normalize_reward`` is on. ``first_token_temperature`` turns on FIRE
    sampling (:meth:`generate`, :meth:`logprobs`); ``overlong_buffer_len`` DAPO's overlong
    shaping (:meth:`shape`). ``engine`` and ``reward`` are ``None`` on the trainer ranks of a
    split placement, where the rollout ranks generate and score.
    """

    engine: RolloutEngine | None
    decode: Decode
    reward: RewardFn | None
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
    first_token_temperature: float | None = None
    overlong_buffer_len: int | None = None
    overlong_penalty_factor: float = 1.0
    reward_clip: float = 0.0
    """Clip each reward to [-c, c] after normalisation, before the KL penalty (0: off)."""
    advantage_clip: float = 0.0
    """Clip each advantage to [-c, c] after the estimator's normalisation (0: off)."""
    layout: TokenLayout = PADDED
    """How :meth:`logprobs`' forwards lay their rows out (:mod:`lrft.trainer.packing`)."""
    max_tokens_per_pass: int | None = None
    """With packed rows: the most tokens of one of :meth:`logprobs`' forwards (None: rows of
    ``micro_batch_size``)."""

    def generate(
        self, prompts: Sequence[PromptSample], params: SamplingParams
    ) -> list[GenerationResult]:
        """``params.n`` results per prompt, prompt-major. Collective over the TP group.

        With ``first_token_temperature`` set and ``params`` not greedy (FIRE sampling), each
        response's first token is sampled at that temperature and the rest at
        ``params.temperature``; engine logprobs follow the same temperatures.
        """
        requests = [
            GenerationRequest(
                prompt_token_ids=p.prompt_token_ids, request_id=str(p.source_index), media=p.media
            )
            for p in prompts
        ]
        if self.first_token_temperature is None or params.greedy:
            return self._generate(requests, params)
        return fire_generate(
            self._generate, requests, params, first_token_temperature=self.first_token_temperature
        )

    def _generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        return self.generate_requests(requests, params)

    def generate_requests(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        """``requests`` through the engine, collective over the TP group (for a driver that
        makes its own requests, such as the multi-turn episode driver)."""
        # An engine that declares tensor_parallel spans its TP group and, by the RolloutEngine
        # contract, gathers the group's requests itself: gathering here too would hand it every
        # request of the group on every rank. Only a single-rank engine needs the gather.
        if self.engine is None:
            raise LrftError("this rank holds no engine: the rollout ranks generate")
        spans_group = "tensor_parallel" in self.engine.capabilities.names()
        group = None if spans_group else self.tp_group
        return tp_group_generate(self.engine.generate, requests, params, group)

    def logprobs(self, model: FrozenModel, sequences: Sequences) -> Tensor:
        """Gradient-free :func:`response_logprobs` of ``model``, forward by forward
        (:func:`lrft.trainer.passes.gradient_free`), on the CPU. Collective."""
        return gradient_free(
            sequences,
            lambda chunk: response_logprobs(
                model.module,
                chunk,
                temperature=self.sampling.temperature,
                device=self.device,
                first_token_temperature=self.first_token_temperature,
                layout=self.layout,
            ),
            micro_batch_size=self.micro_batch_size,
            layout=self.layout,
            max_tokens=self.max_tokens_per_pass,
            device=self.device,
        )

    def shape(self, scores: Tensor, lengths: Tensor) -> Tensor:
        """The rewards the advantages see: ``scores`` (B,) plus DAPO's overlong penalty of
        responses of ``lengths`` tokens when ``overlong_buffer_len`` is set, else ``scores``."""
        if self.overlong_buffer_len is None:
            return scores
        penalty = overlong_penalty(
            lengths,
            max_len=self.sampling.max_new_tokens,
            buffer_len=self.overlong_buffer_len,
            penalty_factor=self.overlong_penalty_factor,
        )
        return scores + penalty.to(scores.dtype)

    def score(
        self, prompts: Sequence[PromptSample], results: Sequence[GenerationResult], n: int
    ) -> tuple[Tensor, dict[str, float]]:
        """The reward of each result (prompt-major, ``n`` per prompt) and the reward's metrics
        averaged (:func:`reward_means`); names a failing sample."""
        output = self.rate(prompts, results, n)
        return output.scores_tensor(), reward_means(output)

    def rate(
        self, prompts: Sequence[PromptSample], results: Sequence[GenerationResult], n: int
    ) -> RewardOutput:
        """The reward function's output for each result (prompt-major, ``n`` per prompt), with
        its per-sample metrics; names a failing sample."""
        if self.reward is None:
            raise LrftError("this rank holds no reward: the rollout ranks score")
        samples = []
        for index, result in enumerate(results):
            prompt = prompts[index // n]
            samples.append(
                RewardSample(
                    prompt=prompt.prompt_text,
                    response=self.decode(result.output_token_ids),
                    label="" if prompt.label is None else str(prompt.label),
                    reference=None if prompt.reference is None else str(prompt.reference),
                    metadata=prompt.metadata,
                    images=() if prompt.media is None else prompt.media.images,
                    audio=() if prompt.media is None else prompt.media.audio,
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
        return output

    def make(
        self,
        sequences: Sequences,
        scores: Tensor,
        old_logprobs: Tensor | None,
        ref_logprobs: Tensor | None,
        *,
        values: Tensor | None = None,
        engine_logprobs: Tensor | None = None,
        token_rewards: Tensor | None = None,
        weight_versions: Tensor | None = None,
        teacher_logprobs: Tensor | None = None,
    ) -> ExperienceBatch:
        """Advantages in one normalisation stage, with DP-global whitening statistics.

        ``values``: the critic's (B, T) values, for value-based estimators; the batch then also
        carries them and the estimator's returns (the critic's targets, never whitened).
        ``engine_logprobs``: the engine's own (B, T) logprobs, carried for truncated importance
        sampling. ``token_rewards``: (B, T) rewards at the tokens that earned them (a multi-turn
        episode's turn rewards, each at its turn's last token) instead of each score at its
        response's last token; ``scores`` are then their sums, which outcome estimators (GRPO)
        compare. ``weight_versions``: (B,) the version of the weights that generated each row,
        carried into the replay buffer. ``teacher_logprobs``: a distillation teacher's (B, T)
        logprobs of the sampled tokens, read with ``old_logprobs`` (the student's).
        """
        mask = sequences.action_mask
        if token_rewards is not None:
            if self.normalize_reward:
                raise ValueError("normalize_reward scales sequence scores, not token rewards")
            rewards = token_rewards.float()
            if self.reward_clip > 0:
                rewards = rewards.clamp(-self.reward_clip, self.reward_clip)
            batch = RewardBatch.from_token_rewards(
                rewards, mask, group_size=self.sampling.n, values=values
            )
        else:
            shaped = scores.double()
            if self.normalize_reward:
                self.reward_moments = self.reward_moments.merge(
                    all_gather_moments(RunningMoments.from_values(scores))
                )
                shaped = self.reward_moments.normalize(shaped)
            if self.reward_clip > 0:
                shaped = shaped.clamp(-self.reward_clip, self.reward_clip)
            batch = RewardBatch.from_sequence_rewards(
                shaped.float(), mask, group_size=self.sampling.n, values=values
            )
        metrics: dict[str, float] = {}
        if ref_logprobs is not None:
            if old_logprobs is None:
                raise ValueError("the KL against the reference needs the old logprobs")
            kl = token_kl(old_logprobs, ref_logprobs, mask, self.kl_estimator)
            metrics["kl"] = float(kl.sum() / mask.sum())
            if self.kl_in_reward:
                penalized = kl_penalized_rewards(batch.token_rewards, kl, mask, self.kl_coef)
                batch = RewardBatch.from_token_rewards(
                    penalized, mask, group_size=self.sampling.n, values=values
                )
        if teacher_logprobs is not None:
            batch, distilled = with_teacher(batch, old_logprobs, teacher_logprobs)
            metrics.update(distilled)
        advantages = compute_advantages(
            self.estimator, batch, self.advantage_params, reduce_moments=all_gather_moments
        )
        per_token = advantages.advantages.float()
        if self.advantage_clip > 0:
            per_token = per_token.clamp(-self.advantage_clip, self.advantage_clip)
        return ExperienceBatch(
            sequences=sequences,
            old_logprobs=old_logprobs,
            ref_logprobs=ref_logprobs,
            scores=scores,
            advantages=per_token,
            metrics=metrics,
            values=values,
            returns=None if values is None else advantages.returns.float(),
            engine_logprobs=engine_logprobs,
            weight_versions=weight_versions,
        )


def reward_means(output: RewardOutput) -> dict[str, float]:
    """Each of the reward's metrics averaged over the samples that measured it, as
    ``reward/<name>``."""
    return {f"reward/{name}": _nanmean(values) for name, values in output.metrics.items()}


def _nanmean(values: Sequence[float]) -> float:
    finite = [v for v in values if v == v]
    return sum(finite) / len(finite) if finite else float("nan")
