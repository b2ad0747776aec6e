"""Hostile tool calls inside a training rollout: each is refused or killed with a clear
observation, and the episode, the rollout and its training tensors carry on.

The model's turns are scripted (an engine that replays them); the tool is the real sandboxed
``python`` tool in the built-in ``tool_calls`` environment, run through the trainer's
:class:`~lrft.trainer.episodes.EpisodeRunner`. A tool that hangs past its own deadline is
given up on by the environment.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from lrft.agents import EnvironmentSetup, GenerateFn
from lrft.agents.sandbox import MiB, SandboxLimits
from lrft.agents.tools import PythonTool
from lrft.api import GenerationRequest, GenerationResult, SamplingParams, ToolResult
from lrft.api.episodes import EpisodeBudget
from lrft.data import PromptSample
from lrft.trainer.episodes import EpisodeBatch, EpisodeRunner
from tests.unit.agents._tokenizer import build_tokenizer

CPU = torch.device("cpu")
LIMITS = SandboxLimits(
    wall_time_s=2.0, cpu_time_s=2, memory_bytes=256 * MiB, output_bytes=1 * MiB, processes=16
)
HOSTILE = {
    "network": (
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)\nprint('connected')",
        ("Network is unreachable", "network access is disabled"),
    ),
    "write outside": (
        "open('/etc/lrft-probe', 'w').write('x')\nprint('wrote')",
        ("Read-only file system", "writing outside"),
    ),
    "memory": (
        "blocks = []\nwhile True:\n    blocks.append(bytearray(32 << 20))",
        ("the memory limit of 256 MiB was reached",),
    ),
    "fork bomb": (
        "import os\nwhile True:\n    os.fork()",
        ("the process limit of 16 was reached", "starting processes is disabled"),
    ),
    "hang": ("import time\ntime.sleep(60)", ("the wall-time limit of 2 s was reached",)),
}


def _scripted(
    tokenizer: PreTrainedTokenizerFast, turns: Sequence[str]
) -> tuple[list[int], GenerateFn]:
    """An engine that answers the ``k``-th call with ``turns[k]`` and the end-of-turn token."""
    end = int(tokenizer.eos_token_id)
    calls: list[int] = []

    def generate(
        requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        text = turns[len(calls)]
        calls.append(len(requests))
        tokens = (*tokenizer(text, add_special_tokens=False)["input_ids"], end)
        return [
            GenerationResult(
                request_id=r.request_id,
                sample_index=0,
                prompt_token_ids=r.prompt_token_ids,
                output_token_ids=tokens,
                finish_reason="stop",
                logprobs=tuple(-0.5 for _ in tokens),
            )
            for r in requests
        ]

    return calls, generate


def _rollout(
    tokenizer: PreTrainedTokenizerFast, turns: Sequence[str], setup: EnvironmentSetup
) -> tuple[list[int], EpisodeBatch]:
    calls, generate = _scripted(tokenizer, turns)
    rollout = EpisodeRunner(
        environment="tool_calls",
        setup=setup,
        budget=EpisodeBudget(max_turns=len(turns), max_total_tokens=1 << 16),
        generate=generate,
        device=CPU,
    )
    prompt = PromptSample(
        prompt_text="q", prompt_token_ids=(1,), raw_input="run the programs", source_index=0
    )
    params = SamplingParams(n=1, max_new_tokens=4096, return_logprobs=True)
    return calls, rollout.run([prompt], params)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def test_each_hostile_program_is_an_observation_and_the_episode_goes_on(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    programs = list(HOSTILE.values())
    turns = [f"<python>{code}</python>" for code, _ in programs] + ["the answer is 42"]
    setup = EnvironmentSetup(tokenizer=tokenizer, tools=[PythonTool(LIMITS)])
    calls, batch = _rollout(tokenizer, turns, setup)
    (episode,) = batch.episodes
    assert calls == [1] * len(turns)
    assert episode.end == "done"
    assert len(episode.turns) == len(turns)
    records = batch.turn_records(lambda ids: str(tokenizer.decode(list(ids))))[0]
    for (name, (_, expected)), record in zip(HOSTILE.items(), records, strict=False):
        observation = record["observation"]
        assert any(text in observation for text in expected), (name, observation)
        assert "connected" not in observation, name
        assert "wrote" not in observation, name
        assert record["metrics"]["tool_failures"] == 1.0, name
    assert records[-1]["model"] == "the answer is 42<|im_end|>"
    # the training tensors hold every turn, the observations masked out
    mask = batch.sequences.action_mask[0]
    assert int(mask.sum()) == episode.model_token_count
    assert batch.sequences.response_lengths is not None
    assert int(batch.sequences.response_lengths[0]) == len(episode.response_token_ids)


class _Hangs:
    """A user tool that breaks its contract: it never returns within its own deadline."""

    name = "hangs"
    description = "sleeps"

    def run(self, arguments: str) -> ToolResult:
        time.sleep(30)
        return ToolResult(output="late")


def test_a_tool_that_hangs_is_given_up_on(tokenizer: PreTrainedTokenizerFast) -> None:
    setup = EnvironmentSetup(tokenizer=tokenizer, tools=[_Hangs()], options={"tool_timeout_s": 0.5})
    began = time.monotonic()
    _, batch = _rollout(tokenizer, ["<hangs>now</hangs>", "done"], setup)
    assert time.monotonic() - began < 10
    (episode,) = batch.episodes
    assert episode.end == "done"
    first = batch.turn_records(lambda ids: str(tokenizer.decode(list(ids))))[0][0]
    assert "[stopped: the tool did not answer within 0.5 s]" in first["observation"]
    assert first["metrics"]["tool_failures"] == 1.0
