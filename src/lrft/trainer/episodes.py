"""Multi-turn rollouts in the trainer: each prompt's ``n`` samples are episodes of an environment.

:class:`EpisodeRunner` turns a rank's prompts into :class:`~lrft.api.EpisodeTask` (the row's
input as written, its reference, label and metadata) and runs them with
:func:`lrft.agents.run_episodes` through the experience maker's TP-group generate, with an
``any_live`` all-reduce over the default group, so that every rank calls the engine in every
round even when its own episodes have all ended. :class:`EpisodeBatch` is what the trainer
reads: :func:`pack_episodes` lays the episodes out as :class:`~lrft.trainer.sequences.Sequences`
whose action mask holds the model's own tokens only (observations are holes in it, and the
explicit ``response_lengths`` say where each response ends), so the policy loss, the KL, the
entropy and truncated importance sampling, all masked by it, train on the model's tokens only.

Rewards: the trainer's reward function scores each episode's final model turn (:attr:`answers`,
one batched, collective-safe call like a single-turn rollout's), and that score is added to the
environment's own per-turn rewards at the last token of the last turn
(:meth:`EpisodeBatch.token_rewards`). An episode's score is the sum, which outcome estimators
(GRPO) compare within its group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lrft.agents import (
    AnyLive,
    EnvironmentSetup,
    Episode,
    EpisodeTensors,
    GenerateFn,
    episode_tensors,
    make_environment,
    make_tool,
    run_episodes,
)
from lrft.agents.registry import environments
from lrft.api.episodes import Environment, EpisodeBudget, EpisodeTask
from lrft.api.errors import ConfigError
from lrft.api.types import GenerationResult, SamplingParams
from lrft.data import PromptSample
from lrft.dist import sum_over_ranks
from lrft.rewards import RewardOutput
from lrft.trainer.experience import Decode
from lrft.trainer.sequences import Sequences


def episode_task(prompt: PromptSample) -> EpisodeTask:
    """The task of a prompt row: its input as written (the formatted prompt text when the row's
    raw input was not kept), reference, label and metadata."""
    raw = prompt.prompt_text if prompt.raw_input is None else prompt.raw_input
    if not isinstance(raw, str | list | tuple):
        raise ConfigError(
            f"prompt row {prompt.source_index}: an episode starts from a string or a "
            f"conversation (a list of {{role, content}}), got a {type(raw).__name__}"
        )
    return EpisodeTask(
        prompt=raw,
        reference=None if prompt.reference is None else str(prompt.reference),
        label="" if prompt.label is None else str(prompt.label),
        metadata=prompt.metadata,
        task_id=str(prompt.source_index),
    )


def pack_episodes(episodes: Sequence[Episode], pad_id: int = 0) -> Sequences:
    """Right-padded ``prompt + response`` rows whose action mask is each episode's model mask
    (observation tokens are not actions) and whose ``response_lengths`` are explicit."""
    return _sequences(episode_tensors(episodes, pad_id=pad_id))


def _sequences(tensors: EpisodeTensors) -> Sequences:
    return Sequences(
        input_ids=tensors.input_ids,
        attention_mask=tensors.attention_mask,
        prompt_lengths=tensors.prompt_lengths,
        action_mask=tensors.action_mask,
        action_tokens=tensors.response_tokens.masked_fill(~tensors.action_mask, 0),
        response_lengths=tensors.response_lengths,
    )


@attrs.frozen(kw_only=True, eq=False)
class EpisodeBatch:
    """One rank's episodes of one rollout, task-major (``n`` per prompt), packed for training."""

    episodes: tuple[Episode, ...]
    sequences: Sequences
    engine_logprobs: Tensor | None  # (B, T) the engine's, 0 at observations and padding
    environment_rewards: Tensor  # (B, T) each turn's environment reward at its last token

    def __len__(self) -> int:
        return len(self.episodes)

    @property
    def answers(self) -> list[GenerationResult]:
        """Each episode's final model turn, after everything before it: what the reward
        function scores."""
        results = []
        for episode in self.episodes:
            last = episode.turns[-1]
            context = episode.prompt_token_ids + episode.response_token_ids[: last.start]
            results.append(
                GenerationResult(
                    request_id=f"{episode.task_index}/{episode.sample_index}",
                    sample_index=episode.sample_index,
                    prompt_token_ids=context,
                    output_token_ids=episode.turn_token_ids(last.index),
                    finish_reason=last.finish_reason,
                )
            )
        return results

    @property
    def responses(self) -> list[GenerationResult]:
        """Each episode as one response (turns and observations after the prompt), for the
        saved trajectories."""
        return [
            GenerationResult(
                request_id=f"{episode.task_index}/{episode.sample_index}",
                sample_index=episode.sample_index,
                prompt_token_ids=episode.prompt_token_ids,
                output_token_ids=episode.response_token_ids,
                finish_reason=episode.turns[-1].finish_reason,
            )
            for episode in self.episodes
        ]

    @property
    def returns(self) -> Tensor:
        """(B,) the environment's return of each episode (the sum of its turn rewards)."""
        return torch.tensor([episode.reward for episode in self.episodes], dtype=torch.float32)

    def token_rewards(self, scores: Tensor) -> Tensor:
        """(B, T): the environment's turn rewards plus ``scores`` (the reward function's, one
        per episode) at the last token of each episode's last turn."""
        rewards = self.environment_rewards.clone()
        for row, episode in enumerate(self.episodes):
            last = episode.turns[-1]
            rewards[row, last.start + last.length - 1] += scores[row]
        return rewards

    def metrics(self) -> dict[str, float]:
        """Means over the episodes: turns, model and observation tokens, the environment's
        step metrics summed per episode (``tool_calls``, ``tool_failures``...), and the share of
        each way an episode ended."""
        if not self.episodes:
            return {}
        count = len(self.episodes)
        totals: dict[str, float] = {
            "episode/turns": sum(len(e.turns) for e in self.episodes) / count,
            "episode/model_tokens": sum(e.model_token_count for e in self.episodes) / count,
            "episode/observation_tokens": sum(
                len(e.response_token_ids) - e.model_token_count for e in self.episodes
            )
            / count,
        }
        for end in ("done", "max_turns", "max_total_tokens"):
            totals[f"episode/end_{end}"] = sum(e.end == end for e in self.episodes) / count
        for episode in self.episodes:
            for turn in episode.turns:
                for name, value in turn.metrics.items():
                    key = f"episode/{name}"
                    totals[key] = totals.get(key, 0.0) + value / count
        return totals

    def turn_records(self, decode: Decode) -> list[list[dict[str, Any]]]:
        """Per episode, one record per turn: the model's text, the observation's text, the
        turn's reward, finish reason and step metrics (tool statuses among them)."""
        records = []
        for episode in self.episodes:
            turns = []
            for turn in episode.turns:
                observation = episode.response_token_ids[
                    turn.start + turn.length : turn.start + turn.length + turn.observation_length
                ]
                turns.append(
                    {
                        "model": decode(episode.turn_token_ids(turn.index)),
                        "observation": decode(observation),
                        "model_tokens": turn.length,
                        "observation_tokens": turn.observation_length,
                        "finish_reason": turn.finish_reason,
                        "reward": turn.reward,
                        "metrics": dict(turn.metrics),
                    }
                )
            records.append(turns)
        return records


def any_live_over_ranks(device: torch.device) -> AnyLive:
    """The driver's ``any_live`` hook: whether any rank of the default group has a live
    episode (an all-reduce; every rank calls it once per round)."""

    def any_live(live_here: bool) -> bool:
        return sum_over_ranks([float(live_here)], device)[0] > 0

    return any_live


def environment_setup(
    environment: str,
    tools: Sequence[str],
    options: Mapping[str, Any],
    tokenizer: PreTrainedTokenizerBase,
) -> EnvironmentSetup:
    """The setup of ``environment``'s episodes (a registered name, or a factory's
    ``module:attribute`` path, registered under itself here), checked by making the tools and
    one environment: an unknown option, or a chat template that cannot render the environment's
    roles, is a ``ConfigError`` here, before any process group or rollout."""
    if environment not in environments.names() and ":" in environment:
        environments.register(environment, environment)  # a module:attribute path
    setup = EnvironmentSetup(
        tokenizer=tokenizer, tools=[make_tool(name) for name in tools], options=options
    )
    make_environment(environment, setup)
    return setup


@attrs.define(kw_only=True)
class EpisodeRunner:
    """Runs a rank's prompts as episodes of ``environment``; see the module docstring.

    ``tools`` are made once (a tool is thread-safe and holds no episode state); a fresh
    environment is made per episode. ``max_workers`` steps the environments of a round in
    threads (tool calls wait on subprocesses).
    """

    environment: str
    setup: EnvironmentSetup
    budget: EpisodeBudget
    generate: GenerateFn
    device: torch.device
    max_workers: int = 1

    @classmethod
    def build(
        cls,
        *,
        environment: str,
        tools: Sequence[str],
        options: Mapping[str, Any],
        tokenizer: PreTrainedTokenizerBase,
        budget: EpisodeBudget,
        generate: GenerateFn,
        device: torch.device,
    ) -> EpisodeRunner:
        """Make the tools and one environment (:func:`environment_setup`)."""
        return cls(
            environment=environment,
            setup=environment_setup(environment, tools, options, tokenizer),
            budget=budget,
            generate=generate,
            device=device,
            # Tool calls wait on subprocesses (the sandbox) or not at all (the calculator).
            max_workers=4 if tools else 1,
        )

    def _environment(self, task: EpisodeTask) -> Environment:
        return make_environment(self.environment, self.setup)

    def run(self, prompts: Sequence[PromptSample], params: SamplingParams) -> EpisodeBatch:
        """``params.n`` episodes per prompt, prompt-major. Collective over the default group
        (and the engine's TP group)."""
        episodes = run_episodes(
            [episode_task(prompt) for prompt in prompts],
            self._environment,
            self.generate,
            params,
            self.budget,
            any_live=any_live_over_ranks(self.device),
            max_workers=self.max_workers,
        )
        if not episodes:
            empty = torch.zeros((0, 0))
            sequences = Sequences(
                input_ids=empty.long(),
                attention_mask=empty.long(),
                prompt_lengths=torch.zeros(0, dtype=torch.long),
                action_mask=empty.bool(),
                action_tokens=empty.long(),
                response_lengths=torch.zeros(0, dtype=torch.long),
            )
            return EpisodeBatch(
                episodes=(), sequences=sequences, engine_logprobs=None, environment_rewards=empty
            )
        tensors = episode_tensors(episodes)
        return EpisodeBatch(
            episodes=tuple(episodes),
            sequences=_sequences(tensors),
            engine_logprobs=tensors.engine_logprobs,
            environment_rewards=tensors.token_rewards,
        )


def with_returns(rewards: RewardOutput, batch: EpisodeBatch) -> RewardOutput:
    """``rewards`` (the reward function's, of each episode's final turn) plus each episode's
    environment return: the episodes' scores, with the reward's own metrics."""
    scores = [
        score + float(extra)
        for score, extra in zip(rewards.scores, batch.returns.tolist(), strict=True)
    ]
    return RewardOutput(scores=scores, metrics=rewards.metrics)


def add_turns(records: Sequence[dict[str, Any]], batch: EpisodeBatch, decode: Decode) -> None:
    """Add each episode's turns (:meth:`EpisodeBatch.turn_records`) and how it ended to its
    saved trajectory record."""
    for record, turns, episode in zip(
        records, batch.turn_records(decode), batch.episodes, strict=True
    ):
        record["turns"] = turns
        record["episode_end"] = episode.end
