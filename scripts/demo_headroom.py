"""Measure the demo's RL headroom: a minimal single-process GRPO loop on the shipped demo model.

Plain PyTorch, independent of lrft's trainer: each step samples ``--group`` answers to each of
``--prompts`` training problems, scores them with the demo's rule reward, normalises the rewards
within each group (GRPO), and takes ``--updates`` AdamW steps on the PPO-clipped surrogate
(token mean over the answer tokens). Held-out greedy accuracy is printed every
``--eval-every`` steps, with the wall time spent outside evaluation. Run from the repository
root::

    python scripts/demo_headroom.py              # ~30 s on one CPU core
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import torch
from transformers import PreTrainedTokenizerBase

from lrft.demos.model import (
    ASSETS_DIR,
    answer_accuracy,
    complete,
    load_model,
    load_tokenizer,
)
from lrft.demos.reward import AdditionReward
from lrft.demos.task import AdditionTask, Problem
from lrft.demos.tokenizer import PAD_ID
from lrft.rewards.base import RewardSample, compute_rewards


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ASSETS_DIR, help="a demo model folder")
    parser.add_argument("--steps", type=int, default=60, help="rollout steps")
    parser.add_argument("--prompts", type=int, default=32, help="problems per step")
    parser.add_argument("--group", type=int, default=8, help="samples per problem")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate")
    parser.add_argument("--clip", type=float, default=0.2, help="PPO clip range")
    parser.add_argument("--updates", type=int, default=2, help="optimizer steps per rollout")
    parser.add_argument("--format-weight", type=float, default=0.0, help="see AdditionReward")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-problems", type=int, default=500, help="held-out problems")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds of training")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


@attrs.frozen(kw_only=True)
class Rollout:
    """One step's samples, ready for the policy update."""

    input_ids: torch.Tensor  # (samples, width), right-padded
    action_mask: torch.Tensor  # (samples, width - 1): which next-token predictions are answers
    old_logprobs: torch.Tensor  # (samples, width - 1)
    advantages: torch.Tensor  # (samples,)


def token_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, temperature: float
) -> torch.Tensor:
    """log pi(token_{t+1} | tokens_<=t) under the sampling temperature, shape (B, T - 1)."""
    logits: torch.Tensor = model(input_ids=input_ids).logits[:, :-1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def rollout(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    args: argparse.Namespace,
    reward: AdditionReward,
    generator: torch.Generator,
) -> tuple[float, Rollout | None]:
    """Sample, score and normalise: the mean reward, and the samples to learn from (``None`` when
    every group's rewards are all equal, so that no advantage is non-zero)."""
    prompts = [tokenizer.encode(p.prompt) for p in problems for _ in range(args.group)]
    torch.nn.Module.eval(model)
    completions = complete(model, prompts, temperature=args.temperature, generator=generator)
    responses = tokenizer.batch_decode(completions, skip_special_tokens=True)
    samples = [
        RewardSample(prompt=p.prompt, response=r, reference=p.answer)
        for p, r in zip([p for p in problems for _ in range(args.group)], responses, strict=True)
    ]
    scores = compute_rewards(reward, samples).scores_tensor().view(len(problems), args.group)
    centred = scores - scores.mean(dim=1, keepdim=True)
    advantages = (centred / (scores.std(dim=1, keepdim=True) + 1e-6)).flatten()
    keep = advantages.abs() > 0  # zero-variance groups carry no signal
    if not bool(keep.any()):
        return float(scores.mean()), None
    rows = [prompts[i] + completions[i] for i in range(len(prompts)) if keep[i]]
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    action_mask = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    kept = [i for i in range(len(prompts)) if keep[i]]
    for row, (index, tokens) in enumerate(zip(kept, rows, strict=True)):
        input_ids[row, : len(tokens)] = torch.tensor(tokens)
        # Position t predicts token t + 1: the answer tokens are predicted from len(prompt) - 1.
        action_mask[row, len(prompts[index]) - 1 : len(tokens) - 1] = True
    with torch.no_grad():
        old_logprobs = token_logprobs(model, input_ids, args.temperature)
    batch = Rollout(
        input_ids=input_ids,
        action_mask=action_mask,
        old_logprobs=old_logprobs,
        advantages=advantages[keep],
    )
    return float(scores.mean()), batch


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Rollout,
    args: argparse.Namespace,
    generator: torch.Generator,
) -> None:
    torch.nn.Module.train(model)
    order = torch.randperm(batch.input_ids.shape[0], generator=generator)
    for indices in order.tensor_split(args.updates):
        if indices.numel() == 0:
            continue
        logprobs = token_logprobs(model, batch.input_ids[indices], args.temperature)
        ratio = torch.exp(logprobs - batch.old_logprobs[indices])
        advantages = batch.advantages[indices, None]
        losses = torch.maximum(
            -advantages * ratio, -advantages * ratio.clamp(1 - args.clip, 1 + args.clip)
        )
        mask = batch.action_mask[indices].float()
        loss = (losses * mask).sum() / mask.sum()
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    task = AdditionTask()
    train, held_out = task.train_problems(), task.eval_problems()[: args.eval_problems]
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99))
    reward = AdditionReward(format_weight=args.format_weight)

    def evaluate() -> float:
        torch.nn.Module.eval(model)
        return answer_accuracy(model, tokenizer, held_out)

    start = evaluate()
    curve = [(0, 0.0, start)]
    print(f"step     0  train 0.0s  held-out greedy {start:.3f}", flush=True)
    training = 0.0
    for step in range(1, args.steps + 1):
        began = time.perf_counter()
        problems = rng.sample(train, args.prompts)
        mean_reward, batch = rollout(model, tokenizer, problems, args, reward, generator)
        if batch is not None:
            policy_update(model, optimizer, batch, args, generator)
        training += time.perf_counter() - began
        last = step == args.steps or training > args.time_limit
        if step % args.eval_every == 0 or last:
            accuracy = evaluate()
            curve.append((step, training, accuracy))
            print(
                f"step {step:5d}  train {training:5.1f}s  reward {mean_reward:.3f}  "
                f"held-out greedy {accuracy:.3f}",
                flush=True,
            )
        if last:
            break
    final = curve[-1][2]
    doubled = next((s for s, _, a in curve if a >= 2 * start), None)
    print(
        f"held-out greedy accuracy {start:.3f} -> {final:.3f} (best {max(a for *_, a in curve):.3f})"
        f" in {curve[-1][0]} steps, {training:.0f}s of training; "
        + (f"doubled by step {doubled}" if doubled is not None else "never doubled")
    )


if __name__ == "__main__":
    main()
