"""The errors lrft raises. Every one derives from :class:`LrftError`."""

from __future__ import annotations


class LrftError(Exception):
    """Base class of every error lrft raises on purpose."""


class ConfigError(LrftError, ValueError):
    """A configuration breaks one rule or several; each problem names the value and the rule.

    ``ConfigError(problem)`` is one problem, and its message is that problem;
    ``ConfigError(first, second, ...)`` lists them all in one message, so that a command line
    with several faults is fixed in one round (:class:`lrft.config.problems.Problems` gathers
    them). ``problems`` holds each one's text.
    """

    def __init__(self, *problems: str) -> None:
        if not problems:
            raise TypeError("ConfigError needs at least one problem")
        self.problems: tuple[str, ...] = tuple(str(problem) for problem in problems)
        super().__init__(problems_message(self.problems))

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, ...]]:
        # rebuilt with each problem (an error crossing processes keeps its list)
        return (type(self), self.problems)


def problems_message(problems: tuple[str, ...]) -> str:
    """One problem as it is; several as a numbered list under a line that counts them."""
    if len(problems) == 1:
        return problems[0]
    listed = "\n".join(f"  {number}. {problem}" for number, problem in enumerate(problems, 1))
    return f"{len(problems)} problems, each to fix before the run can start:\n{listed}"


class CapabilityNotSupported(LrftError):
    """A backend was asked for something its declared capabilities say it cannot do."""

    def __init__(self, backend: str, capability: str, detail: str = "") -> None:
        self.backend = backend
        self.capability = capability
        message = f"{backend} does not support {capability}"
        super().__init__(f"{message}: {detail}" if detail else message)


class EngineAsleepError(LrftError):
    """``generate`` (or a weight load) was called while the memory it needs is released."""


class StaleWeightsError(LrftError):
    """The engine's weights are not a complete, verified copy of any trainer version."""


class WeightLoadError(LrftError, ValueError):
    """A tensor offered to ``load_weights`` does not fit the engine (unknown name, wrong shape)."""


class WeightSyncError(LrftError):
    """A weight sync failed; the engine was left stale, never serving the old weights as new."""


class CollectiveTimeout(LrftError, TimeoutError):
    """A collective operation did not complete within its timeout."""


class EpisodeError(LrftError):
    """An environment or the episode driver broke the multi-turn contract (a step after the
    episode ended, a prompt that leaves no room for a model turn, an environment that raised);
    the message names the episode."""
