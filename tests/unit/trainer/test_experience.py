"""Packing, response logprobs against a per-row forward, rewards naming the sample, the buffer."""

from __future__ import annotations

import pytest
import torch

from lrft.api.types import GenerationResult, SamplingParams
from lrft.data import PromptSample
from lrft.rewards import PerSampleReward, RewardError, RewardSample
from lrft.testing.models import tiny_causal_lm
from lrft.trainer.experience import ExperienceBatch, ExperienceMaker, response_logprobs
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.sequences import pack


def _result(prompt: list[int], output: list[int], sample: int = 0) -> GenerationResult:
    return GenerationResult(
        request_id="r",
        sample_index=sample,
        prompt_token_ids=prompt,
        output_token_ids=output,
        finish_reason="stop",
    )


RESULTS = [_result([5, 6, 7], [8, 9]), _result([10], [11, 12, 13, 14]), _result([3, 4], [5])]


def test_pack_right_pads_and_aligns_responses() -> None:
    packed = pack(RESULTS)
    assert packed.input_ids.tolist() == [
        [5, 6, 7, 8, 9],
        [10, 11, 12, 13, 14],
        [3, 4, 5, 0, 0],
    ]
    assert packed.attention_mask.sum(-1).tolist() == [5, 5, 3]
    assert packed.action_mask.sum(-1).tolist() == [2, 4, 1]
    assert packed.action_tokens[1].tolist() == [11, 12, 13, 14]


def test_response_logprobs_equal_an_unpadded_forward_per_row() -> None:
    model = tiny_causal_lm(0)
    temperature = 0.7
    got = response_logprobs(
        model, pack(RESULTS), temperature=temperature, device=torch.device("cpu")
    )
    for row, result in enumerate(RESULTS):
        ids = torch.tensor([list(result.prompt_token_ids) + list(result.output_token_ids)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double() / temperature
        p = len(result.prompt_token_ids)
        expected = [
            torch.log_softmax(logits[p + t - 1], -1)[token].item()
            for t, token in enumerate(result.output_token_ids)
        ]
        n = len(expected)
        assert got[row, :n].tolist() == pytest.approx(expected, abs=1e-5)
        assert got[row, n:].abs().sum() == 0


def _prompt(index: int) -> PromptSample:
    return PromptSample(
        prompt_text=f"p{index}", prompt_token_ids=[1, 2], source_index=index, reference="3"
    )


def test_a_reward_that_raises_names_the_sample_and_its_prompt() -> None:
    def score(sample: RewardSample) -> float:
        if sample.response == "bad":
            raise ValueError("cannot score")
        return 1.0

    responses: dict[tuple[int, ...], str] = {(5,): "ok", (6,): "bad"}
    maker = ExperienceMaker(
        engine=None,  # scoring never touches the engine
        decode=lambda ids: responses[tuple(ids)],
        reward=PerSampleReward(name="picky", score=score),
        sampling=SamplingParams(n=2),
        estimator="group_norm",
        micro_batch_size=2,
        device=torch.device("cpu"),
    )
    results = [
        _result([1, 2], [5]),
        _result([1, 2], [5], 1),
        _result([1, 2], [5]),
        _result([1, 2], [6], 1),
    ]
    with pytest.raises(
        RewardError, match=r"'picky' failed at sample 3: .*cannot score.*prompt row 1 'p1'"
    ):
        maker.score([_prompt(0), _prompt(1)], results, 2)


def _batch(rows: int) -> ExperienceBatch:
    results = [_result([1], [2 + i] * (1 + i % 3)) for i in range(rows)]
    sequences = pack(results)
    values = torch.arange(rows, dtype=torch.float32)
    return ExperienceBatch(
        sequences=sequences,
        old_logprobs=values[:, None].expand_as(sequences.action_mask).clone(),
        ref_logprobs=None,
        scores=values,
        advantages=torch.zeros(sequences.action_mask.shape),
    )


def test_replay_buffer_covers_every_row_once_in_a_seeded_order() -> None:
    buffer = ReplayBuffer(seed=3)
    buffer.append(_batch(10))
    first = [mb.scores.tolist() for mb in buffer.micro_batches(4, epoch=0)]
    again = [mb.scores.tolist() for mb in buffer.micro_batches(4, epoch=0)]
    other = [mb.scores.tolist() for mb in buffer.micro_batches(4, epoch=1)]
    assert first == again
    assert first != other
    assert [len(mb) for mb in first] == [4, 4, 2]
    assert sorted(x for mb in first for x in mb) == list(range(10))
    for mb in buffer.micro_batches(3, epoch=0):  # rows keep their own tensors together
        assert mb.old_logprobs is not None
        assert mb.old_logprobs[:, 0].tolist() == mb.scores.tolist()


@pytest.mark.parametrize("estimator", ["reinforce_baseline", "group_norm", "rloo", "dr_grpo"])
def test_normalised_rewards_of_groups_that_all_score_alike_give_zero_advantages(
    estimator: str,
) -> None:
    # --normalize_reward with binary rewards: one prompt solved by all 8 samples, two by none.
    # The running normalisation maps them to 1.38 and -0.69 (float32), whose float32 group
    # means were an ulp off; reinforce_baseline's whitening then made advantages up to 1.25.
    maker = ExperienceMaker(
        engine=None,  # make() never touches the engine
        decode=lambda ids: "",
        reward=PerSampleReward(name="unused", score=lambda sample: 0.0),
        sampling=SamplingParams(n=8),
        estimator=estimator,
        micro_batch_size=8,
        device=torch.device("cpu"),
        normalize_reward=True,
    )
    sequences = pack([_result([1, 2], [3 + i % 4] * (1 + i % 3), i % 8) for i in range(24)])
    scores = torch.tensor([1.0] * 8 + [0.0] * 16)
    batch = maker.make(sequences, scores, None, None)
    assert maker.reward_moments.count == 24
    assert torch.equal(batch.advantages, torch.zeros_like(batch.advantages))
