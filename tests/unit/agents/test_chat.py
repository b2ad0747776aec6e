"""Transcripts against the tokenizer's chat template on a hand-built reference conversation."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from transformers import BatchEncoding, PreTrainedTokenizerFast

from lrft.agents import (
    ChatTemplateTranscript,
    GenerateFn,
    TemplateMismatchError,
    TextTranscript,
    ToolCallEnvironment,
    run_episodes,
)
from lrft.agents.tools import Calculator
from lrft.api import (
    ChatMessage,
    EpisodeBudget,
    EpisodeTask,
    GenerationRequest,
    GenerationResult,
    ModelTurn,
    SamplingParams,
)
from tests.unit.agents._tokenizer import THINK_TEMPLATE, TRIM_TEMPLATE, build_tokenizer

SYSTEM = "You add numbers with a calculator."
QUESTION = "What is 12345 * 6789?"
TURNS = ("<calculator>12345*6789</calculator>", "The answer is 83810205.")
REFERENCE = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": TURNS[0]},
    {"role": "tool", "content": "83810205"},
    {"role": "assistant", "content": TURNS[1]},
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def _scripted_engine(turns: Sequence[Sequence[int]]) -> tuple[list[list[float]], GenerateFn]:
    """An engine that answers turn ``k`` with ``turns[k]`` and distinct logprobs per token."""
    given: list[list[float]] = []

    def generate(
        requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        results = []
        for request in requests:
            tokens = tuple(turns[len(given)])
            logprobs = [-(len(given) + 1) - i / 100 for i in range(len(tokens))]
            given.append(logprobs)
            results.append(
                GenerationResult(
                    request_id=request.request_id,
                    sample_index=0,
                    prompt_token_ids=request.prompt_token_ids,
                    output_token_ids=tokens,
                    finish_reason="stop",
                    logprobs=tuple(logprobs),
                )
            )
        return results

    return given, generate


def _assistant_mask(tokenizer: PreTrainedTokenizerFast, text: str) -> list[bool]:
    """True at the tokens of each assistant message's content and its <|im_end|>, found in the
    rendered text by character offsets (independently of any transcript)."""
    header = "<|im_start|>assistant\n"
    spans = []
    at = text.find(header)
    while at != -1:
        start = at + len(header)
        end = text.index("<|im_end|>", start) + len("<|im_end|>")
        spans.append((start, end))
        at = text.find(header, end)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return [
        any(s <= begin and finish <= e for s, e in spans)
        for begin, finish in encoded["offset_mapping"]
    ]


def test_reference_conversation_tokens_mask_and_logprobs(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(end, int)
    turns = [[*tokenizer.encode(t, add_special_tokens=False), end] for t in TURNS]
    given, generate = _scripted_engine(turns)

    def make(_: EpisodeTask) -> ToolCallEnvironment:
        transcript = ChatTemplateTranscript(tokenizer, system_prompt=SYSTEM, check_tokens=True)
        return ToolCallEnvironment(
            transcript=transcript,
            tools=[Calculator()],
            score=lambda task, answer: float("83810205" in answer),
        )

    params = SamplingParams(max_new_tokens=64, stop_token_ids=[end], return_logprobs=True)
    budget = EpisodeBudget(max_turns=4, max_total_tokens=400)
    (episode,) = run_episodes([EpisodeTask(prompt=QUESTION)], make, generate, params, budget)

    reference_text = tokenizer.apply_chat_template(REFERENCE, tokenize=False)
    assert isinstance(reference_text, str)
    encoded = tokenizer.apply_chat_template(REFERENCE, tokenize=True)
    assert isinstance(encoded, BatchEncoding)
    reference_ids = [int(i) for i in encoded["input_ids"]]
    # The template closes the last turn with "\n" after <|im_end|>; the episode ends at the
    # model's <|im_end|>, where the model stopped.
    assert list(episode.token_ids) == reference_ids[:-1]
    assert tokenizer.decode(reference_ids[-1:]) == "\n"
    assert f"{tokenizer.decode(list(episode.token_ids))}\n" == reference_text

    mask = [False] * len(episode.prompt_token_ids) + list(episode.model_mask)
    assert mask == _assistant_mask(tokenizer, reference_text)[:-1]

    engine_logprobs = [value for turn in given for value in turn]
    assert episode.logprobs is not None
    assert [
        lp for lp, m in zip(episode.logprobs, episode.model_mask, strict=True) if m
    ] == engine_logprobs
    assert all(
        lp == 0.0 for lp, m in zip(episode.logprobs, episode.model_mask, strict=True) if not m
    )
    assert episode.end == "done"
    assert [t.reward for t in episode.turns] == [0.0, 1.0]
    assert episode.turns[0].metrics["tool_calls"] == 1.0


def test_text_transcript_appends_formatted_observations(tokenizer: PreTrainedTokenizerFast) -> None:
    transcript = TextTranscript(tokenizer, message_format="\n[{role}] {content}\n")
    prompt = transcript.start(EpisodeTask(prompt="12+30="))
    assert tokenizer.decode(list(prompt)) == "12+30="
    end = tokenizer.eos_token_id
    assert transcript.model_turn([*tokenizer.encode("42", add_special_tokens=False), end]) == "42"
    observed = transcript.observe([ChatMessage(role="tool", content="ok")])
    assert tokenizer.decode(list(observed)) == "\n[tool] ok\n"
    with pytest.raises(ValueError, match="needs a string prompt"):
        transcript.start(EpisodeTask(prompt=[{"role": "user", "content": "hi"}]))


def _assistant(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]


def test_a_template_that_trims_content_is_refused() -> None:
    tokenizer = build_tokenizer(TRIM_TEMPLATE)
    transcript = ChatTemplateTranscript(tokenizer)
    transcript.start(EpisodeTask(prompt="hi"))
    transcript.model_turn(_assistant(tokenizer, " the answer "))
    with pytest.raises(TemplateMismatchError, match="does not render the conversation"):
        transcript.observe([ChatMessage(role="user", content="and then?")])


def test_a_template_that_rewrites_earlier_turns_is_refused() -> None:
    tokenizer = build_tokenizer(THINK_TEMPLATE)
    transcript = ChatTemplateTranscript(tokenizer)
    transcript.start(EpisodeTask(prompt="hi"))
    transcript.model_turn(_assistant(tokenizer, "<think>the cat</think>the answer"))
    with pytest.raises(TemplateMismatchError, match=r"renders '.*the answer"):
        transcript.observe([ChatMessage(role="user", content="and then?")])


def test_the_same_template_is_prefix_stable_without_reasoning() -> None:
    tokenizer = build_tokenizer(THINK_TEMPLATE)
    transcript = ChatTemplateTranscript(tokenizer, check_tokens=True)
    transcript.start(EpisodeTask(prompt="hi"))
    transcript.model_turn(_assistant(tokenizer, "the answer"))
    transcript.observe([ChatMessage(role="user", content="and then?")])


def test_a_turn_ended_by_another_stop_token_is_refused(tokenizer: PreTrainedTokenizerFast) -> None:
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert isinstance(pad, int)
    transcript = ChatTemplateTranscript(tokenizer, end_of_turn_ids=[pad])
    transcript.start(EpisodeTask(prompt="hi"))
    transcript.model_turn([*tokenizer.encode("the answer", add_special_tokens=False), pad])
    with pytest.raises(TemplateMismatchError):
        transcript.observe([ChatMessage(role="tool", content="1")])


def test_tokens_the_tokenizer_would_not_choose_keep_the_text_but_not_the_ids(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    # The model spells "calculator" byte by byte; the tokenizer encodes it as one token.
    spelled = [tokenizer.convert_tokens_to_ids(c) for c in "calculator"]
    assert tokenizer.encode("calculator", add_special_tokens=False) != spelled
    turn = [*spelled, tokenizer.eos_token_id]

    lenient = ChatTemplateTranscript(tokenizer)
    lenient.start(EpisodeTask(prompt="hi"))
    lenient.model_turn(turn)
    lenient.observe([ChatMessage(role="tool", content="1")])
    assert tokenizer.decode(lenient.token_ids) == lenient.render(add_generation_prompt=True)

    strict = ChatTemplateTranscript(tokenizer, check_tokens=True)
    start = len(strict.start(EpisodeTask(prompt="hi")))
    strict.model_turn(turn)
    with pytest.raises(TemplateMismatchError, match=f"at token {start}:"):
        strict.observe([ChatMessage(role="tool", content="1")])


def test_a_template_mismatch_ends_the_tool_episode() -> None:
    trimming = build_tokenizer(TRIM_TEMPLATE)
    env = ToolCallEnvironment(transcript=ChatTemplateTranscript(trimming), tools=[Calculator()])
    env.reset(EpisodeTask(prompt="hi"))
    step = env.step(
        ModelTurn(
            index=0,
            token_ids=_assistant(trimming, " <calculator>1+1</calculator> "),
            finish_reason="stop",
        )
    )
    assert step.done
    assert step.metrics["template_mismatch"] == 1.0
