"""Step boundaries found in the decoded text of a response, and step scores placed on them."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from lrft.demos.tokenizer import EOS_ID, build_tokenizer
from lrft.rewards.process import place_step_rewards, step_ends, step_probabilities

TOKENIZER = build_tokenizer()  # one token per byte: positions are character positions


def _ids(text: str) -> list[int]:
    return list(TOKENIZER.encode(text, add_special_tokens=False))


def _decode(ids: Sequence[int]) -> str:
    return str(TOKENIZER.decode(list(ids), skip_special_tokens=False))


def test_each_separator_ends_a_step_and_the_last_token_ends_the_last() -> None:
    ids = [*_ids("12+3=15;15*2=30;30"), EOS_ID]
    # "12+3=15;" ends at index 7, "15*2=30;" at 15, then "30" ends at 17 (the EOS is not a step)
    assert step_ends(ids, ";", _decode, special_ids={EOS_ID}) == [7, 15, 17]


def test_a_response_ending_with_the_separator_has_no_empty_last_step() -> None:
    assert step_ends(_ids("a;b;"), ";", _decode) == [1, 3]
    assert step_ends(_ids("a\n\nb"), "\n\n", _decode) == [2, 3]
    assert step_ends([EOS_ID], ";", _decode, special_ids={EOS_ID}) == []


def test_a_separator_merged_into_one_token_with_its_neighbours_is_found() -> None:
    # a tokenizer of words: "x;" and ";y" are single tokens, the separator is inside them
    vocab = ["step", "x;", ";y", "z"]

    def decode(ids: Sequence[int]) -> str:
        return "".join(vocab[i] for i in ids)

    assert step_ends([0, 1, 0, 2, 3], ";", decode) == [1, 3, 4]


def test_a_character_split_across_tokens_is_counted_by_prefix() -> None:
    ids = _ids("é;ü")  # two bytes each: alone, each byte decodes to a replacement character
    assert len(ids) == 5
    assert step_ends(ids, ";", _decode) == [2, 4]


def test_step_scores_of_one_and_two_label_heads() -> None:
    one = torch.tensor([[0.0], [2.0]])
    assert step_probabilities(one).tolist() == pytest.approx([0.5, 1 / (1 + math.exp(-2))])
    two = torch.tensor([[1.0, 1.0], [0.0, math.log(3.0)]])
    assert step_probabilities(two).tolist() == pytest.approx([0.5, 0.75])
    with pytest.raises(ValueError, match="1 or 2 labels, got 3"):
        step_probabilities(torch.zeros(1, 3))


def test_scores_are_placed_on_the_step_ends() -> None:
    placed = place_step_rewards([[1, 3], [0]], [[0.25, 0.5], [1.0]], width=4)
    assert placed.tolist() == [[0.0, 0.25, 0.0, 0.5], [1.0, 0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="row 0: 1 scores for 2 step ends"):
        place_step_rewards([[1, 3]], [[0.25]], width=4)
