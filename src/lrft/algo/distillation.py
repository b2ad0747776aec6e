"""On-policy distillation: a teacher's logprobs of the student's own samples as advantages.

The student samples a response; the teacher scores every sampled token; the per-token reverse
KL estimate ``log p_student(y_t) - log p_teacher(y_t)`` (the k1 estimate of
``KL(student || teacher)`` at the sampled token) becomes a negative advantage, so the policy
gradient lowers the student's probability where it exceeds the teacher's and raises it where it
falls short (Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes"; Lu and Thinking Machines Lab 2025, "On-Policy Distillation").

LightRFT's names and formula (``--advantage_estimator on_policy_distillation``,
``--opd_kl_coef``): ``A_t = -opd_kl_coef * clamp(log p_student - log p_teacher, -20, 20)``.
The clamp keeps one token the teacher finds (nearly) impossible from dominating a batch.

- ``on_policy_distillation``: that advantage alone; the task reward is not read (it is still
  computed and logged unless the run says ``--no_task_reward``);
- ``on_policy_distillation_hybrid``: the task reward's GRPO advantage (``group_norm``, each
  response's normalised score on each of its tokens) plus the distillation advantage, as
  LightRFT adds them when it keeps the task reward.

Neither is whitened afterwards (``whiten=False``): the distillation term is a log-ratio in nats,
meaningful as it is, and ``group_norm``'s term is already normalised per prompt. The student's
logprobs are the behaviour policy's (the trainer's own forward before the update), so the
advantage is constant with respect to the parameters being trained, like any advantage.
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from lrft.algo._tensor import as_mask, check_2d, check_same_shape, fill_masked
from lrft.algo.advantages import group_norm
from lrft.algo.registry import register_advantage_estimator
from lrft.algo.types import AdvantageParams, Advantages, RewardBatch

LOG_RATIO_CLAMP = 20.0
"""The bound on ``|log p_student - log p_teacher|`` of one token (LightRFT's)."""


def distillation_advantages(
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    action_mask: Tensor,
    *,
    coef: float,
    clamp: float = LOG_RATIO_CLAMP,
) -> Tensor:
    """(B, T): ``-coef * clamp(student - teacher, -clamp, clamp)`` on the valid tokens, 0 on
    the others. Masked entries may hold anything (NaN included): they never reach the result."""
    mask = as_mask(action_mask)
    check_2d("student_logprobs", student_logprobs)
    check_same_shape(
        "student_logprobs", student_logprobs, teacher_logprobs=teacher_logprobs, action_mask=mask
    )
    if not clamp > 0:
        raise ValueError(f"clamp must be > 0, got {clamp!r}")
    student = fill_masked(student_logprobs.detach(), mask)
    teacher = fill_masked(teacher_logprobs.detach().to(student.dtype), mask)
    log_ratio = torch.clamp(student - teacher, -clamp, clamp)
    return fill_masked(-coef * log_ratio, mask)


def with_teacher(
    batch: RewardBatch, student: Tensor | None, teacher: Tensor
) -> tuple[RewardBatch, dict[str, float]]:
    """``batch`` with the student's and the teacher's (B, T) logprobs of the sampled tokens,
    and how far apart they are: ``distill/reverse_kl``, the mean over valid tokens of ``log
    p_student - log p_teacher`` (the k1 estimate of KL(student || teacher) on the student's
    samples), and ``distill/teacher_logprob``, the teacher's mean logprob of those tokens."""
    if student is None:
        raise ValueError("distillation needs the student's (old) logprobs of the samples")
    mask = batch.action_mask
    tokens = mask.sum().clamp(min=1)
    log_ratio = (student - teacher).masked_fill(~mask, 0.0)
    metrics = {
        "distill/reverse_kl": float(log_ratio.sum() / tokens),
        "distill/teacher_logprob": float(teacher.masked_fill(~mask, 0.0).sum() / tokens),
    }
    return attrs.evolve(batch, logprobs=student, teacher_logprobs=teacher), metrics


def _distillation_term(batch: RewardBatch, params: AdvantageParams, estimator: str) -> Tensor:
    if batch.logprobs is None or batch.teacher_logprobs is None:
        raise ValueError(
            f"{estimator} needs the student's and the teacher's logprobs of the sampled tokens "
            "(RewardBatch.logprobs and RewardBatch.teacher_logprobs)"
        )
    term = distillation_advantages(
        batch.logprobs, batch.teacher_logprobs, batch.action_mask, coef=params.opd_kl_coef
    )
    return term.to(batch.token_rewards.dtype)


@register_advantage_estimator(
    "on_policy_distillation", whiten=False, needs_teacher=True, reads=("opd_kl_coef",)
)
def on_policy_distillation(batch: RewardBatch, params: AdvantageParams) -> Advantages:
    """On-policy distillation: A_t = -opd_kl_coef * clamp(log p_student - log p_teacher, ±20)
    (LightRFT's); the task reward is not read."""
    per_token = _distillation_term(batch, params, "on_policy_distillation")
    return Advantages(
        advantages=per_token, returns=per_token.clone(), action_mask=batch.action_mask
    )


@register_advantage_estimator(
    "on_policy_distillation_hybrid",
    whiten=False,
    needs_groups=True,
    needs_teacher=True,
    reads=("opd_kl_coef", "group_std_eps"),
)
def on_policy_distillation_hybrid(batch: RewardBatch, params: AdvantageParams) -> Advantages:
    """The task reward's GRPO advantage (group_norm) plus the on-policy distillation
    advantage, token by token (LightRFT's hybrid)."""
    task = group_norm(batch, params).advantages
    per_token = task + _distillation_term(batch, params, "on_policy_distillation_hybrid")
    return Advantages(
        advantages=per_token, returns=per_token.clone(), action_mask=batch.action_mask
    )
