"""An environment for trainer tests that answers every first turn, whatever the model wrote.

Importable as ``tests.trainer.episode_env:Relay`` (``--environment`` takes a factory's path):
a random model never writes a tool call, yet its episodes must have observations between turns
for the holes in the action mask to be exercised end to end.
"""

from __future__ import annotations

from lrft.agents import EnvironmentSetup
from lrft.api.episodes import EpisodeStart, EpisodeTask, ModelTurn, StepResult

OBSERVATION = "\n="
"""What the environment appends after the first turn."""
FIRST_TURN_REWARD = 0.25
"""The environment's reward of the first turn; the final turn's is the trainer's reward."""


class Relay:
    """Two model turns: the first is answered with :data:`OBSERVATION`, the second ends the
    episode."""

    def __init__(self, setup: EnvironmentSetup) -> None:
        self.tokenizer = setup.tokenizer

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def reset(self, task: EpisodeTask) -> EpisodeStart:
        assert isinstance(task.prompt, str)
        return EpisodeStart(prompt_token_ids=self._encode(task.prompt))

    def step(self, turn: ModelTurn) -> StepResult:
        if turn.index == 0:
            return StepResult(
                observation_token_ids=self._encode(OBSERVATION), reward=FIRST_TURN_REWARD
            )
        return StepResult(done=True)


class ToolRelay(Relay):
    """:class:`Relay` whose observation is what each offered tool answers to ``2+3`` (a random
    model never calls a tool): ``--tools`` decides what the model reads after its first turn."""

    def __init__(self, setup: EnvironmentSetup) -> None:
        super().__init__(setup)
        self.tools = setup.tools

    def step(self, turn: ModelTurn) -> StepResult:
        if turn.index == 0:
            answers = "".join(f"{tool.name}:{tool.run('2+3').output}" for tool in self.tools)
            return StepResult(observation_token_ids=self._encode(f"\n{answers}"))
        return StepResult(done=True)
