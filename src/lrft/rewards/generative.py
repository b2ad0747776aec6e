"""Generative reward models: a causal LM judges each response, and its verdict is the score.

:class:`GenerativeReward` renders each sample into a judge prompt with a
:class:`~lrft.rewards.judge_template.JudgeTemplate`, generates the judge's answer greedily through
any :class:`~lrft.api.RolloutEngine` (``hf`` or ``vllm``), and parses the verdict. A verdict that
cannot be parsed scores the template's ``unparsable_score`` (or the one given here) and is
counted in the ``unparsable`` metric (1 for that sample, 0 for the others), so the trainer logs
the fraction as ``reward/<name>/unparsable``.

:func:`judge_prompt_ids` is the one tokenisation of a judge prompt: the GRM reward and
``lrft train-rm --generative`` both use it, so the judge generates after exactly the tokens it was
trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from lrft.api.errors import LrftError
from lrft.api.protocols import RolloutEngine
from lrft.api.types import GenerationRequest, SamplingParams
from lrft.api.validators import positive_number
from lrft.rewards._checks import name_validator
from lrft.rewards.base import RewardError, RewardOutput, RewardSample
from lrft.rewards.judge_template import JudgeTemplate


class JudgeTokenizer(Protocol):
    """The tokenizer calls a judge needs (Hugging Face tokenizers satisfy it)."""

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(
        self, token_ids: list[int], *, skip_special_tokens: bool = ...
    ) -> str | list[str]: ...

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> object: ...


def judge_prompt_ids(text: str, tokenizer: JudgeTokenizer, *, chat: bool) -> list[int]:
    """The token ids of the judge prompt ``text``: as a user message of the tokenizer's chat
    template with the generation prompt (``chat``), else the text with the tokenizer's special
    tokens."""
    if not chat:
        return list(tokenizer.encode(text, add_special_tokens=True))
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    assert isinstance(rendered, str)  # tokenize=False
    # The chat template writes the special tokens it wants into the text.
    return list(tokenizer.encode(rendered, add_special_tokens=False))


@attrs.frozen(kw_only=True, eq=False)
class GenerativeReward:
    """The judge's parsed verdict on each sample as its score (see the module docstring).

    ``engine`` serves the judge and must be awake when this is called (the trainer's colocated
    wrapper wakes it for the call and puts it back to sleep). It is asked once per batch, greedily,
    for at most ``max_new_tokens`` tokens, stopping at ``stop_token_ids`` (the judge's EOS); an
    engine whose ranks step together (vLLM's data parallelism) is called on every rank, with or
    without samples. A failure of the engine is a :class:`RewardError` (never retried sample by
    sample: generation may be collective). A sample whose template needs a reference it lacks is
    a :class:`RewardError` naming it. Metrics: ``unparsable`` (1 or 0) and ``verdict_tokens``.
    """

    engine: RolloutEngine
    tokenizer: JudgeTokenizer
    template: JudgeTemplate
    max_new_tokens: int = attrs.field(default=64, validator=positive_number)
    stop_token_ids: tuple[int, ...] = ()
    apply_chat_template: bool = False
    unparsable_score: float | None = None
    """The score of an unparsable verdict; ``None``: the template's."""
    name: str = attrs.field(default="grm", validator=name_validator)

    @property
    def fallback_score(self) -> float:
        if self.unparsable_score is not None:
            return self.unparsable_score
        return self.template.unparsable_score

    def judge_texts(self, samples: Sequence[RewardSample]) -> list[str]:
        """What the judge generates from, for each sample (the rendered template)."""
        texts = []
        for index, sample in enumerate(samples):
            try:
                texts.append(
                    self.template.render(
                        prompt=sample.prompt, response=sample.response, reference=sample.reference
                    )
                )
            except ValueError as error:
                raise RewardError(
                    reward=self.name, sample_index=index, detail=str(error)
                ) from error
        return texts

    def requests(self, samples: Sequence[RewardSample]) -> list[GenerationRequest]:
        """The judge's generation requests, one per sample."""
        requests = []
        for index, text in enumerate(self.judge_texts(samples)):
            try:
                ids = judge_prompt_ids(text, self.tokenizer, chat=self.apply_chat_template)
                requests.append(GenerationRequest(prompt_token_ids=ids))
            except Exception as error:
                raise RewardError(
                    reward=self.name,
                    sample_index=index,
                    detail=f"tokenising the judge prompt raised {type(error).__name__}: {error}",
                ) from error
        return requests

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        requests = self.requests(samples)
        params = SamplingParams(
            n=1,
            temperature=0.0,
            max_new_tokens=self.max_new_tokens,
            stop_token_ids=self.stop_token_ids,
        )
        try:
            results = self.engine.generate(requests, params)
        except LrftError:
            raise
        except Exception as error:
            raise RewardError(
                reward=self.name,
                detail=f"the judge's generate raised {type(error).__name__}: {error}",
            ) from error
        scores: list[float] = []
        unparsable: list[float] = []
        lengths: list[float] = []
        for result in results:
            verdict = self.tokenizer.decode(list(result.output_token_ids), skip_special_tokens=True)
            assert isinstance(verdict, str)  # one sequence decodes to one string
            score = self.template.parse(verdict)
            unparsable.append(float(score is None))
            scores.append(self.fallback_score if score is None else score)
            lengths.append(float(len(result.output_token_ids)))
        return RewardOutput(
            scores=scores, metrics={"unparsable": unparsable, "verdict_tokens": lengths}
        )
