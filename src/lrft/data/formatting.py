"""Turning a row's input into prompt text: an input template, the tokenizer's chat template, or both.

The two compose rather than exclude each other: the input template formats the user's text, and
with ``apply_chat_template`` that text becomes the user message of the chat. (LightRFT silently
ignores its input template once the chat template is on; here every option given has an effect,
and one that cannot have any is an error.)
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from lrft.api.errors import ConfigError
from lrft.data.errors import PromptDataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_PLACEHOLDER_NAMES = ("", "input")


def _check_template(_: object, attribute: attrs.Attribute[str], template: str) -> None:
    try:
        fields = [
            (name, spec, conversion)
            for _literal, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as error:  # an unmatched single brace
        raise ConfigError(
            f"{attribute.name} {template!r} is not a valid format string ({error}); write a "
            "literal brace as {{ or }}"
        ) from error
    if len(fields) != 1:
        raise ConfigError(
            f"{attribute.name} {template!r} must have exactly one placeholder, {{}} or {{input}}, "
            f"found {len(fields)}; write a literal brace as {{{{ or }}}}"
        )
    name, spec, conversion = fields[0]
    if name not in _PLACEHOLDER_NAMES or spec or conversion:
        raise ConfigError(
            f"{attribute.name} {template!r} has the placeholder {{{name}"
            f"{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}; "
            "it must be exactly {} or {input}"
        )


@attrs.frozen
class InputTemplate:
    """A format string with exactly one placeholder, ``{}`` or ``{input}``, for the input text.

    Other braces must be doubled (``\\boxed{{}}``), as in ``str.format``; anything else is
    rejected when the template is made, not when the first prompt is formatted.
    """

    template: str = attrs.field(validator=_check_template)

    def format(self, text: str) -> str:
        # The template holds exactly one field, named "" or "input": give it both ways.
        return self.template.format(text, input=text)


def _optional_template(value: str | InputTemplate | None) -> InputTemplate | None:
    if value is None or isinstance(value, InputTemplate):
        return value
    return InputTemplate(value)


@attrs.frozen(kw_only=True)
class PromptFormat:
    """How a row's input becomes prompt text.

    - ``input_template``: applied to the input text (a string input only);
    - ``apply_chat_template``: render the tokenizer's chat template with the generation prompt
      appended. A string input becomes one user message; a list of ``{"role", "content"}``
      messages is used as it is;
    - ``system_prompt``: a system message put first (needs ``apply_chat_template``; a row whose
      conversation already starts with a system message is an error rather than a silent pick).
    """

    apply_chat_template: bool = False
    system_prompt: str | None = None
    input_template: InputTemplate | None = attrs.field(default=None, converter=_optional_template)

    def __attrs_post_init__(self) -> None:
        if self.system_prompt is not None and not self.apply_chat_template:
            raise ConfigError(
                "system_prompt needs apply_chat_template=True (without a chat template there is "
                "no system message to put it in; write it into input_template instead)"
            )


def check_tokenizer(prompt_format: PromptFormat, tokenizer: PreTrainedTokenizerBase) -> None:
    """Fail before reading any data if the chat template is asked for but missing, or cannot
    take the system prompt."""
    if prompt_format.apply_chat_template and not tokenizer.chat_template:
        raise ConfigError(
            f"apply_chat_template=True but the tokenizer ({type(tokenizer).__name__}) has no "
            "chat_template; set one on the tokenizer, or use an input_template instead"
        )
    if prompt_format.system_prompt is not None:
        check_system_role(prompt_format.system_prompt, tokenizer)


def check_system_role(system_prompt: str, tokenizer: PreTrainedTokenizerBase) -> None:
    """Refuse ``system_prompt`` when the tokenizer's chat template has no system role: it raises
    on a system message (as Gemma's and many small models' templates do) or renders the
    conversation without the system prompt's text."""
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": "Hi"}]
    fix = "drop --system_prompt, or write the instructions into --input_template instead"
    try:
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
    # A template's raise_exception is a jinja2 TemplateError; a template may fail in other ways
    # on a role it does not expect (a KeyError, a TypeError): each means the same here.
    except Exception as error:
        raise ConfigError(
            f"--system_prompt is set, but the model's chat template cannot take a system "
            f"message: it raised {type(error).__name__}: {error}; {fix}"
        ) from error
    if isinstance(rendered, str) and system_prompt.strip() not in rendered:
        raise ConfigError(
            "--system_prompt is set, but the model's chat template drops system messages (the "
            f"rendered prompt does not contain it); {fix}"
        )


def format_prompt(
    value: object,
    prompt_format: PromptFormat,
    tokenizer: PreTrainedTokenizerBase,
    *,
    where: str,
) -> str:
    """The prompt text for one row's input ``value``; ``where`` names the row in errors."""
    if isinstance(value, str) and not prompt_format.apply_chat_template:
        return (
            value
            if prompt_format.input_template is None
            else prompt_format.input_template.format(value)
        )
    messages = chat_messages(value, prompt_format, where=where)
    rendered = tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=True,
    )
    if not isinstance(rendered, str):
        raise TypeError(
            f"apply_chat_template(tokenize=False) returned {type(rendered).__name__}, expected str"
        )
    return rendered


def chat_messages(
    value: object, prompt_format: PromptFormat, *, where: str
) -> list[dict[str, Any]]:
    """The chat messages of one row's input ``value`` (for ``apply_chat_template``): a string
    becomes one user message (after the input template), a list of messages is taken as it is;
    the system prompt goes first."""
    if isinstance(value, str):
        text = (
            value
            if prompt_format.input_template is None
            else prompt_format.input_template.format(value)
        )
        messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    elif isinstance(value, Sequence) and not isinstance(value, bytes):
        if not prompt_format.apply_chat_template:
            raise PromptDataError(
                f"{where}: the input is a list of messages, which needs apply_chat_template=True"
            )
        if prompt_format.input_template is not None:
            raise PromptDataError(
                f"{where}: the input is a list of messages; input_template formats a string "
                "input only"
            )
        messages = _messages(value, where)
    else:
        raise PromptDataError(
            f"{where}: the input must be a string or a list of chat messages, "
            f"got {type(value).__name__} ({value!r:.80})"
        )
    if prompt_format.system_prompt is not None:
        if messages and messages[0]["role"] == "system":
            raise PromptDataError(
                f"{where}: the conversation already starts with a system message and "
                "system_prompt is set; remove one of them"
            )
        messages.insert(0, {"role": "system", "content": prompt_format.system_prompt})
    return messages


def _messages(value: Sequence[object], where: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for position, message in enumerate(value):
        if (
            not isinstance(message, Mapping)
            or not isinstance(message.get("role"), str)
            or "content" not in message
        ):
            raise PromptDataError(
                f"{where}: message {position} of the conversation must be an object with a "
                f"string 'role' and a 'content', got {message!r:.80}"
            )
        messages.append(dict(message))
    if not messages:
        raise PromptDataError(f"{where}: the conversation is empty")
    return messages
