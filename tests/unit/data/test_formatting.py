"""Input templates and chat templates, checked against prompt strings written out by hand."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from lrft.api import ConfigError
from lrft.data import InputTemplate, PromptDataError, PromptFormat, format_prompt
from lrft.data.formatting import check_tokenizer
from tests.unit.data._tokenizer import build_tokenizer

CHAT = PromptFormat(apply_chat_template=True)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("Q: {}", "Q: 2+2"),
        ("Q: {input}\nA:", "Q: 2+2\nA:"),
        ("{}", "2+2"),
        ("Answer in \\boxed{{}}: {}", "Answer in \\boxed{}: 2+2"),
    ],
)
def test_valid_input_templates_format_the_input(template: str, expected: str) -> None:
    assert InputTemplate(template).format("2+2") == expected


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("no placeholder", "found 0"),
        ("{} and {}", "found 2"),
        ("{input} {}", "found 2"),
        ("\\boxed{} {}", "found 2"),
        ("{0}", r"placeholder \{0\}"),
        ("{question}", r"placeholder \{question\}"),
        ("{:>8}", r"placeholder \{:>8\}"),
        ("{input!r}", r"placeholder \{input!r\}"),
        ("Q: {", "not a valid format string"),
        ("Q: }", "not a valid format string"),
    ],
)
def test_invalid_input_templates_are_rejected_when_made(template: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        InputTemplate(template)


def test_plain_input_without_templates_is_the_input_itself(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    assert format_prompt("2+2=?", PromptFormat(), tokenizer, where="r") == "2+2=?"


def test_chat_template_wraps_a_string_as_the_user_message(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    text = format_prompt("2+2=?", CHAT, tokenizer, where="r")
    assert text == "<|im_start|>user\n2+2=?<|im_end|>\n<|im_start|>assistant\n"


def test_system_prompt_and_input_template_compose_with_the_chat_template(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    prompt_format = PromptFormat(
        apply_chat_template=True, system_prompt="Be brief.", input_template="Q: {}"
    )
    assert format_prompt("2+2", prompt_format, tokenizer, where="r") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nQ: 2+2<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_conversation_input_is_rendered_as_given(tokenizer: PreTrainedTokenizerFast) -> None:
    conversation = [
        {"role": "user", "content": "1+1"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "and 2+2?"},
    ]
    prompt_format = PromptFormat(apply_chat_template=True, system_prompt="S")
    assert format_prompt(conversation, prompt_format, tokenizer, where="r") == (
        "<|im_start|>system\nS<|im_end|>\n"
        "<|im_start|>user\n1+1<|im_end|>\n"
        "<|im_start|>assistant\n2<|im_end|>\n"
        "<|im_start|>user\nand 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert len(conversation) == 3  # the row's own list is not modified


def test_system_prompt_without_chat_template_is_an_error() -> None:
    with pytest.raises(ConfigError, match="system_prompt needs apply_chat_template"):
        PromptFormat(system_prompt="Be brief.")


def test_chat_template_asked_for_but_missing_fails_before_any_row() -> None:
    bare = build_tokenizer(chat_template=None)
    with pytest.raises(ConfigError, match="has no chat_template"):
        check_tokenizer(CHAT, bare)
    check_tokenizer(PromptFormat(), bare)  # no chat template needed


NO_SYSTEM_ROLE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
)
DROPS_SYSTEM = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "<|im_start|>user\n{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
)


def test_a_system_prompt_on_a_template_without_a_system_role_is_a_config_error() -> None:
    told = PromptFormat(apply_chat_template=True, system_prompt="Be brief.")
    check_tokenizer(told, build_tokenizer())  # the test template has a system role
    with pytest.raises(ConfigError) as raised:
        check_tokenizer(told, build_tokenizer(chat_template=NO_SYSTEM_ROLE))
    message = str(raised.value)
    assert message.startswith("--system_prompt is set, but the model's chat template cannot take")
    assert "TemplateError: System role not supported" in message
    assert message.endswith(
        "drop --system_prompt, or write the instructions into --input_template instead"
    )
    with pytest.raises(ConfigError, match=r"--system_prompt .* chat template drops system"):
        check_tokenizer(told, build_tokenizer(chat_template=DROPS_SYSTEM))
    # without a system prompt either template is fine
    check_tokenizer(CHAT, build_tokenizer(chat_template=NO_SYSTEM_ROLE))


@pytest.mark.parametrize(
    ("value", "prompt_format", "message"),
    [
        ([{"role": "user", "content": "x"}], PromptFormat(), "needs apply_chat_template"),
        (
            [{"role": "user", "content": "x"}],
            PromptFormat(apply_chat_template=True, input_template="Q: {}"),
            "input_template formats a string input only",
        ),
        (
            [{"role": "system", "content": "a"}, {"role": "user", "content": "x"}],
            PromptFormat(apply_chat_template=True, system_prompt="b"),
            "already starts with a system message",
        ),
        ([{"content": "x"}], CHAT, "message 0 .* string 'role'"),
        ([{"role": "user"}], CHAT, "message 0 .* 'content'"),
        ([], CHAT, "the conversation is empty"),
        (42, PromptFormat(), "must be a string or a list of chat messages, got int"),
        (None, CHAT, "got NoneType"),
    ],
)
def test_inputs_that_cannot_be_formatted_name_the_row(
    value: object,
    prompt_format: PromptFormat,
    message: str,
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    with pytest.raises(PromptDataError, match=f"^data.jsonl row 7: .*{message}"):
        format_prompt(value, prompt_format, tokenizer, where="data.jsonl row 7")
