"""Transcripts: an episode's conversation as tokens, grown turn by turn, never re-encoded.

A :class:`Transcript` is per episode. ``start`` gives the prompt's tokens; ``model_turn`` records
the model's tokens as sampled and returns their text; ``observe`` renders new messages (tool
results, a user's reply) and returns the tokens to append.

:class:`ChatTemplateTranscript` keeps what the model sees equal to what the tokenizer's chat
template renders for the whole conversation. It holds the conversation as messages and as
tokens. After a model turn, the assistant message is the turn's text (its end-of-turn token
removed, since the template writes that itself); the observation is the template's rendering of
the whole conversation, with the new messages and the next generation prompt, minus the text the
tokens so far decode to. It checks that this text is a prefix of that rendering: then the
concatenation of prompt, turns and observations decodes to exactly the template's text for the
whole conversation, by construction. Where it is not a prefix, the template does not render the
conversation the way the model produced it, and :class:`TemplateMismatchError` says where:

- templates that rewrite earlier turns (Qwen3 and DeepSeek-R1 drop the reasoning of assistant
  turns before the last user message; a new user message mid-episode then changes the past);
- templates that reformat the content (``| trim`` in Llama 3's strips a turn's leading and
  trailing whitespace, which the model's tokens keep);
- a model turn ended by a token that is not the template's end of turn.

Equal text does not always mean equal tokens: the model's tokens are kept as sampled, and they
are not always the tokenizer's own encoding of their text (a model may spell ``hello`` as ``hel``
``lo``); and each observation is encoded on its own, which equals the whole text's encoding at
that point only when a token boundary falls there (chat templates put special tokens at the
seams, which makes it so for their own text). ``check_tokens=True`` compares the tokens with the
tokenizer's encoding of the whole rendered conversation after every observation and raises at
the first difference (a test of a template and tokenizer, not meant for every training step).
The environment decides what a mismatch does to its episode (the built-in one ends it).

:class:`TextTranscript` is for models without a chat template: the prompt text as it is, and
each observation a format string's rendering.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from lrft.api.episodes import ChatMessage, EpisodeTask
from lrft.api.errors import ConfigError, LrftError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class TemplateMismatchError(LrftError):
    """The chat template renders the conversation differently from the tokens the model saw."""


class Transcript(Protocol):
    """One episode's conversation; see the module docstring."""

    def start(self, task: EpisodeTask) -> tuple[int, ...]: ...

    def model_turn(self, token_ids: Sequence[int]) -> str: ...

    def observe(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]: ...


def _end_of_turn(tokenizer: PreTrainedTokenizerBase, ids: Collection[int] | None) -> frozenset[int]:
    if ids is not None:
        return frozenset(int(i) for i in ids)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ConfigError("the tokenizer has no eos_token_id: pass end_of_turn_ids")
    return frozenset([int(eos)])


class _Tokens:
    """Encode and decode exactly: no special tokens added, no spaces cleaned up."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, end_of_turn_ids: frozenset[int]):
        self.tokenizer = tokenizer
        self.end_of_turn_ids = end_of_turn_ids

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(int(i) for i in self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        assert isinstance(text, str)
        return text

    def content(self, ids: Sequence[int]) -> str:
        """A turn's text without the end-of-turn token that closed it."""
        if ids and ids[-1] in self.end_of_turn_ids:
            ids = ids[:-1]
        return self.decode(ids)


def _difference(expected: str, actual: str) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b),
        min(len(expected), len(actual)),
    )
    return (
        f"at character {at}: the template renders {expected[max(at - 40, 0) : at + 40]!r}, the "
        f"tokens decode to {actual[max(at - 40, 0) : at + 40]!r}"
    )


class ChatTemplateTranscript:
    """A conversation rendered by the tokenizer's chat template, exactly; see the module.

    ``end_of_turn_ids``: the tokens that end a model turn (default: the tokenizer's EOS); the
    engine must stop on them. ``system_prompt`` is put first (a task whose conversation already
    starts with a system message is an error). ``template_kwargs`` go to every
    ``apply_chat_template`` call (``tools=[...]`` for templates that describe tools).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        end_of_turn_ids: Collection[int] | None = None,
        system_prompt: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        check_tokens: bool = False,
    ) -> None:
        if not tokenizer.chat_template:
            raise ConfigError(
                f"the tokenizer ({type(tokenizer).__name__}) has no chat_template; use "
                "TextTranscript, or set one"
            )
        self._tokens = _Tokens(tokenizer, _end_of_turn(tokenizer, end_of_turn_ids))
        self.system_prompt = system_prompt
        self.template_kwargs = dict(template_kwargs or {})
        self.check_tokens = check_tokens
        self.messages: list[ChatMessage] = []
        self.token_ids: list[int] = []

    def render(self, *, add_generation_prompt: bool) -> str:
        """The template's text for the conversation so far."""
        text = self._tokens.tokenizer.apply_chat_template(
            [m.as_dict() for m in self.messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
        return text

    def check_roles(self, roles: Sequence[str]) -> None:
        """Raise ``ConfigError`` unless the template renders a conversation of a user message,
        an assistant reply and a message of each of ``roles`` (call it before any episode)."""
        probe = [ChatMessage(role="user", content="1"), ChatMessage(role="assistant", content="2")]
        self.messages = [*probe, *(ChatMessage(role=role, content="3") for role in roles)]
        try:
            self.render(add_generation_prompt=True)
        except Exception as error:
            raise ConfigError(
                f"the tokenizer's chat template cannot render a conversation with "
                f"{', '.join(repr(r) for r in ['user', 'assistant', *roles])} messages "
                f"({type(error).__name__}: {error}); use another role or no chat template"
            ) from error
        finally:
            self.messages = []

    def start(self, task: EpisodeTask) -> tuple[int, ...]:
        if isinstance(task.prompt, str):
            messages = [ChatMessage(role="user", content=task.prompt)]
        else:
            messages = list(task.prompt)
        if self.system_prompt is not None:
            if messages[0].role == "system":
                raise ConfigError(
                    f"task {task.task_id!r} starts with a system message and system_prompt is set"
                )
            messages.insert(0, ChatMessage(role="system", content=self.system_prompt))
        self.messages = messages
        text = self.render(add_generation_prompt=True)
        ids = self._tokens.encode(text)
        if self._tokens.decode(ids) != text:
            raise TemplateMismatchError(
                "the tokenizer does not decode the prompt back to the text it encoded ("
                f"{_difference(text, self._tokens.decode(ids))}); a normalising tokenizer "
                "cannot keep a conversation's text exact: use TextTranscript"
            )
        self.token_ids = list(ids)
        return ids

    def model_turn(self, token_ids: Sequence[int]) -> str:
        ids = [int(i) for i in token_ids]
        self.token_ids += ids
        content = self._tokens.content(ids)
        self.messages.append(ChatMessage(role="assistant", content=content))
        return content

    def observe(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        self.messages += messages
        full = self.render(add_generation_prompt=True)
        seen = self._tokens.decode(self.token_ids)
        if not full.startswith(seen):
            raise TemplateMismatchError(
                "the chat template does not render the conversation as the model saw it "
                f"(after {len(self.messages)} messages, {_difference(full, seen)})"
            )
        ids = self._tokens.encode(full[len(seen) :])
        self.token_ids += ids
        if self.check_tokens:
            whole = self._tokens.encode(full)
            if whole != tuple(self.token_ids):
                at = next(
                    (
                        i
                        for i, (a, b) in enumerate(zip(whole, self.token_ids, strict=False))
                        if a != b
                    ),
                    min(len(whole), len(self.token_ids)),
                )
                raise TemplateMismatchError(
                    f"the tokens differ from the tokenizer's encoding of the rendered conversation "
                    f"at token {at}: {list(self.token_ids[at : at + 8])} against "
                    f"{list(whole[at : at + 8])}"
                )
        return ids


class TextTranscript:
    """A plain-text conversation: the prompt as written, each message through ``message_format``.

    ``message_format`` has the fields ``{role}`` and ``{content}`` (default: the content on a line
    of its own). A task's prompt must be a string.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        message_format: str = "\n{content}\n",
        end_of_turn_ids: Collection[int] | None = None,
    ) -> None:
        try:
            message_format.format(role="tool", content="")
        except (KeyError, IndexError, ValueError) as error:
            raise ConfigError(
                f"message_format {message_format!r} may use only {{role}} and {{content}} ({error})"
            ) from error
        self._tokens = _Tokens(tokenizer, _end_of_turn(tokenizer, end_of_turn_ids))
        self.message_format = message_format

    def start(self, task: EpisodeTask) -> tuple[int, ...]:
        if not isinstance(task.prompt, str):
            raise ConfigError(
                f"TextTranscript needs a string prompt; task {task.task_id!r} is a conversation "
                "(use ChatTemplateTranscript)"
            )
        return self._tokens.encode(task.prompt)

    def model_turn(self, token_ids: Sequence[int]) -> str:
        return self._tokens.content([int(i) for i in token_ids])

    def observe(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        text = "".join(self.message_format.format(role=m.role, content=m.content) for m in messages)
        return self._tokens.encode(text)
