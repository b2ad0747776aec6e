"""Multi-turn, tool-using rollouts: the machinery behind the contracts in :mod:`lrft.api`.

- :func:`run_episodes`: the episode driver. It runs many episodes at once and batches every live
  episode's next model turn into one ``RolloutEngine.generate`` call per round, alike on every
  rank; it enforces :class:`~lrft.api.EpisodeBudget` and produces one :class:`Episode` per
  episode (tokens, model-token mask, engine logprobs, per-turn rewards);
- :func:`episode_tensors`: episodes as padded training tensors whose action mask holds the
  model's own tokens only;
- transcripts (:mod:`lrft.agents.chat`): conversations as tokens that equal the chat template's
  rendering of the whole conversation, the model's tokens never re-encoded;
- :class:`ToolCallEnvironment`, the built-in environment, and the built-in tools
  :class:`~lrft.agents.tools.Calculator` and :class:`~lrft.agents.tools.PythonTool` (a sandboxed
  subprocess: :mod:`lrft.agents.sandbox`);
- the registry of tools and environments (:func:`register_tool`, :func:`register_environment`,
  entry points ``lrft.tools`` / ``lrft.environments``).

No process group is touched here: a trainer passes the collective parts in (``generate``, and
``any_live`` to agree on whether another round runs).
"""

from lrft.agents.batch import EpisodeTensors, episode_tensors
from lrft.agents.chat import (
    ChatTemplateTranscript,
    TemplateMismatchError,
    TextTranscript,
    Transcript,
)
from lrft.agents.driver import AnyLive, GenerateFn, local_any_live, run_episodes
from lrft.agents.episode import Episode, TurnRecord
from lrft.agents.registry import (
    EnvironmentFactory,
    EnvironmentSetup,
    ToolFactory,
    make_environment,
    make_tool,
    register_environment,
    register_tool,
)
from lrft.agents.tool_env import (
    Scorer,
    TagCallFormat,
    ToolCall,
    ToolCallEnvironment,
    ToolCallFormat,
)

__all__ = [
    "AnyLive",
    "ChatTemplateTranscript",
    "EnvironmentFactory",
    "EnvironmentSetup",
    "Episode",
    "EpisodeTensors",
    "GenerateFn",
    "Scorer",
    "TagCallFormat",
    "TemplateMismatchError",
    "TextTranscript",
    "ToolCall",
    "ToolCallEnvironment",
    "ToolCallFormat",
    "ToolFactory",
    "Transcript",
    "TurnRecord",
    "episode_tensors",
    "local_any_live",
    "make_environment",
    "make_tool",
    "register_environment",
    "register_tool",
    "run_episodes",
]
