"""Scalar reward models: batched, padded scores equal a plain forward of each sample alone."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2ForSequenceClassification

from lrft.api.errors import ConfigError
from lrft.rewards import (
    RewardError,
    RewardFn,
    RewardSample,
    SequenceClassifierReward,
    compute_rewards,
)
from lrft.testing.models import INITIALIZER_RANGE, tiny_qwen2_config

TEXTS = [
    "What is 2 + 3? The answer is 5.",
    "Name a colour. Blue is a colour.",
    "<think>add the numbers</think> \\boxed{5}",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained here on a few strings: no download, every text encodable."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(TEXTS * 4, trainer=trainer)
    # transformers 5 leaves this constructor unannotated.
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )


def classifier(vocab_size: int, seed: int) -> Qwen2ForSequenceClassification:
    config = tiny_qwen2_config(vocab_size=vocab_size)  # pad_token_id=0 is "<pad>" above
    config.num_labels = 1
    config.initializer_range = INITIALIZER_RANGE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # transformers 5 builds this class generically, with an unannotated constructor.
        model = Qwen2ForSequenceClassification(config)  # type: ignore[no-untyped-call]
    torch.nn.Module.eval(model)  # PreTrainedModel re-declares eval without annotations
    return model


@pytest.fixture(scope="module")
def model(tokenizer: PreTrainedTokenizerFast) -> Qwen2ForSequenceClassification:
    return classifier(len(tokenizer), seed=0)


# Lengths differ, so micro-batches of 2 and 4 pad some rows: padding must not change a score.
BATCH = [
    RewardSample(prompt="What is 2 + 3? ", response="The answer is 5."),
    RewardSample(prompt="Name a colour. ", response="Blue"),
    RewardSample(prompt="", response="<think>add the numbers</think> \\boxed{5}"),
    RewardSample(prompt="What is 2 + 3?", response=" 7"),
    RewardSample(prompt="Name a colour. ", response="Blue is a colour, and so is red."),
]


def plain_scores(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> list[float]:
    """The reference: each text alone, unpadded, through the model's own forward."""
    scores = []
    with torch.no_grad():
        for sample in BATCH:
            ids = tokenizer(sample.prompt + sample.response, return_tensors="pt")["input_ids"]
            scores.append(float(model(input_ids=ids).logits[0, 0]))
    return scores


@pytest.mark.parametrize("micro_batch_size", [1, 2, 4])
def test_scores_equal_a_plain_forward_of_each_sample(
    model: Qwen2ForSequenceClassification,
    tokenizer: PreTrainedTokenizerFast,
    micro_batch_size: int,
) -> None:
    reward = SequenceClassifierReward(
        model=model, tokenizer=tokenizer, micro_batch_size=micro_batch_size
    )
    assert isinstance(reward, RewardFn)
    output = compute_rewards(reward, BATCH)
    expected = plain_scores(model, tokenizer)
    assert output.scores == pytest.approx(expected, abs=1e-5)
    assert len(set(expected)) == len(expected)  # the samples really score differently
    assert output.metrics["truncated"] == (0.0,) * len(BATCH)


class Handle:
    """A stand-in for a colocated FrozenModel: the module behind it can change between calls."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.current = module

    @property
    def module(self) -> torch.nn.Module:
        return self.current


def test_the_module_is_looked_up_through_the_handle_at_every_call(
    model: Qwen2ForSequenceClassification, tokenizer: PreTrainedTokenizerFast
) -> None:
    handle = Handle(model)
    reward = SequenceClassifierReward(model=handle, tokenizer=tokenizer, micro_batch_size=3)
    first = compute_rewards(reward, BATCH).scores
    other = classifier(len(tokenizer), seed=1)
    handle.current = other  # e.g. reloaded after an offload, as a different module object
    second = compute_rewards(reward, BATCH).scores
    assert first == pytest.approx(plain_scores(model, tokenizer), abs=1e-5)
    assert second == pytest.approx(plain_scores(other, tokenizer), abs=1e-5)
    assert first != pytest.approx(second, abs=1e-3)


def test_a_long_text_keeps_its_end_and_is_counted(
    model: Qwen2ForSequenceClassification, tokenizer: PreTrainedTokenizerFast
) -> None:
    sample = BATCH[4]
    ids = tokenizer(sample.prompt + sample.response)["input_ids"]
    keep = len(ids) - 3
    reward = SequenceClassifierReward(model=model, tokenizer=tokenizer, max_length=keep)
    output = compute_rewards(reward, [BATCH[1], sample])
    with torch.no_grad():
        tail = float(model(input_ids=torch.tensor([ids[-keep:]])).logits[0, 0])
    assert output.scores[1] == pytest.approx(tail, abs=1e-5)
    assert output.metrics["truncated"] == (0.0, 1.0)


def test_padding_needs_a_pad_id(tokenizer: PreTrainedTokenizerFast) -> None:
    model = classifier(len(tokenizer), seed=0)
    model.config.pad_token_id = None
    alone = SequenceClassifierReward(model=model, tokenizer=tokenizer, micro_batch_size=1)
    assert len(compute_rewards(alone, BATCH[:2])) == 2  # no padding, no pad id needed
    batched = SequenceClassifierReward(model=model, tokenizer=tokenizer, micro_batch_size=2)
    with pytest.raises(ConfigError, match=r"pad_token_id is None, but micro-batches of 2"):
        compute_rewards(batched, BATCH[:2])


class Exploding(torch.nn.Module):
    """A model whose forward fails (as an out-of-memory error would); counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.calls = 0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        raise RuntimeError("out of memory")


def test_a_failing_forward_names_the_micro_batch_and_is_not_repeated(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    model = Exploding()
    reward = SequenceClassifierReward(model=model, tokenizer=tokenizer, micro_batch_size=1)
    with pytest.raises(
        RewardError, match=r"the forward of samples 0..0 raised RuntimeError: out of memory"
    ) as info:
        compute_rewards(reward, BATCH[:3])
    assert info.value.sample_index is None
    # one forward only: re-running samples on one rank alone would hang a collective forward
    assert model.calls == 1


def test_a_failing_text_names_the_sample(
    model: Qwen2ForSequenceClassification, tokenizer: PreTrainedTokenizerFast
) -> None:
    def text(sample: RewardSample) -> str:
        return sample.prompt + sample.response.encode("ascii").decode()

    reward = SequenceClassifierReward(model=model, tokenizer=tokenizer, text=text)
    batch = [BATCH[0], RewardSample(prompt="", response="café")]
    with pytest.raises(
        RewardError,
        match=r"'reward_model' failed at sample 1: tokenising raised UnicodeEncodeError",
    ):
        compute_rewards(reward, batch)


def test_validation(
    model: Qwen2ForSequenceClassification, tokenizer: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(ValueError, match="micro_batch_size must be > 0, got 0"):
        SequenceClassifierReward(model=model, tokenizer=tokenizer, micro_batch_size=0)
    with pytest.raises(ValueError, match="max_length must be a positive integer, got 0"):
        SequenceClassifierReward(model=model, tokenizer=tokenizer, max_length=0)
