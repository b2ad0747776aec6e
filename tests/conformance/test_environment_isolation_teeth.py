"""``check_environment`` runs each task alone, among the other tasks' episodes and again after
them: environments whose instances share state fail, with a message naming the task, the turn
and the reward it got alone and with the others. A correct environment passes."""

from __future__ import annotations

from typing import ClassVar

import attrs
import pytest

from lrft.api import EpisodeError, EpisodeStart, EpisodeTask, ModelTurn, StepResult
from lrft.testing.environments import EnvironmentCheckError, check_environment

TASKS = [
    EpisodeTask(prompt="a", reference="5 6", task_id="a"),
    EpisodeTask(prompt="b", reference="7 8", task_id="b"),
]
ANSWERS = {"a": (5, 6), "b": (7, 8)}


def _script(task: EpisodeTask, index: int, context: object) -> list[int]:
    del index, context
    return list(ANSWERS[task.task_id or ""])


@attrs.define
class Answers:
    """One turn: rewarded 1.0 when the turn is the task's answer. ``fault`` switches on one way
    of sharing state between instances."""

    fault: str = ""
    task: EpisodeTask | None = None
    #: tasks solved by any instance ("remembers_solved"); the task of the last reset of any
    #: instance ("shares_the_task")
    solved: ClassVar[set[str]] = set()
    current: ClassVar[EpisodeTask | None] = None

    def reset(self, task: EpisodeTask) -> EpisodeStart:
        self.task = task
        type(self).current = task
        return EpisodeStart(prompt_token_ids=(1, 2))

    def step(self, turn: ModelTurn) -> StepResult:
        if self.task is None:
            raise EpisodeError("step before reset")
        task = type(self).current if self.fault == "shares_the_task" else self.task
        assert task is not None
        self.task = None
        correct = tuple(turn.token_ids) == ANSWERS[task.task_id or ""]
        if correct:
            type(self).solved.add(task.task_id or "")
        if self.fault == "remembers_solved" and task.task_id in type(self).solved:
            correct = True
        return StepResult(done=True, reward=float(correct))


@pytest.fixture(autouse=True)
def _forget_shared_state() -> None:
    Answers.solved.clear()
    Answers.current = None


def test_a_correct_environment_passes() -> None:
    report = check_environment(Answers, TASKS, vocab_size=10, script=_script)
    assert [episode.reward for episode in report.scripted] == [1.0, 1.0]


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (
            "remembers_solved",
            r"task 0 \('a'\) with fixed random turns: the same turns gave another episode among "
            r"the other tasks' episodes \(one run of the driver, interleaved\) than alone: turn 0 "
            r"is rewarded 1\.0 where alone it was rewarded 0\.0\. An episode must depend on its "
            r"task and turns only",
        ),
        (
            "shares_the_task",
            r"task 0 \('a'\) with your turns: the same turns gave another episode among the other "
            r"tasks' episodes .* turn 0 is rewarded 0\.0 where alone it was rewarded 1\.0",
        ),
    ],
)
def test_instances_that_share_state_fail(fault: str, message: str) -> None:
    with pytest.raises(EnvironmentCheckError, match=message):
        check_environment(lambda: Answers(fault=fault), TASKS, vocab_size=10, script=_script)
