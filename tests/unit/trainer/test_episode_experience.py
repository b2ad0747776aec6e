"""Multi-turn experience against a conversation built by hand with a tokenizer's chat template.

The reference episode (user question, a calculator call, the tool's result, the answer) is
tokenised segment by segment from the template's own renderings; logprobs are checked against a
plain transformers forward over the whole conversation, and the policy loss's gradients against
the same loss computed on the model's tokens only (observations absent from its tensors), so an
observation token that reached the loss would show as a gradient difference.
"""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from lrft.agents import Episode, TurnRecord
from lrft.algo import PolicyLossInputs, policy_losses
from lrft.api.episodes import EpisodeTask
from lrft.api.types import SamplingParams
from lrft.config import TrainConfig
from lrft.testing.models import INITIALIZER_RANGE, tiny_qwen2_config
from lrft.trainer.episodes import EpisodeBatch, pack_episodes
from lrft.trainer.experience import ExperienceBatch, ExperienceMaker, response_logprobs
from lrft.trainer.policy import PolicyUpdate
from lrft.trainer.replay import ReplayBuffer
from tests.unit.agents._tokenizer import IM_END, build_tokenizer

CPU = torch.device("cpu")
CONVERSATION = [
    {"role": "user", "content": "what is 12345 * 6789"},
    {"role": "assistant", "content": "<calculator>12345*6789</calculator>"},
    {"role": "tool", "content": "83810205"},
    {"role": "assistant", "content": "the answer is 83810205"},
]
TURN_REWARDS = (0.25, 1.0)


def _render(tokenizer: PreTrainedTokenizerFast, messages: list[dict[str, str]], gen: bool) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert isinstance(text, str)
    return text


def _encode(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _reference_episode(tokenizer: PreTrainedTokenizerFast, sample: int = 0) -> Episode:
    """The conversation as an episode: each segment the template's text, encoded by itself."""
    end = int(tokenizer.convert_tokens_to_ids(IM_END))  # type: ignore[arg-type]  # one token: one id
    prompt_text = _render(tokenizer, CONVERSATION[:1], True)
    first = [*_encode(tokenizer, CONVERSATION[1]["content"]), end]
    before_result = prompt_text + CONVERSATION[1]["content"] + IM_END
    after_result = _render(tokenizer, CONVERSATION[:3], True)
    assert after_result.startswith(before_result)
    observation = _encode(tokenizer, after_result[len(before_result) :])
    second = [*_encode(tokenizer, CONVERSATION[3]["content"]), end]
    response = first + observation + second
    return Episode(
        task_index=0,
        sample_index=sample,
        task=EpisodeTask(prompt=CONVERSATION[0]["content"]),
        prompt_token_ids=tuple(_encode(tokenizer, prompt_text)),
        response_token_ids=tuple(response),
        model_mask=tuple([True] * len(first) + [False] * len(observation) + [True] * len(second)),
        logprobs=tuple([-0.5] * len(first) + [0.0] * len(observation) + [-0.25] * len(second)),
        turns=(
            TurnRecord(
                index=0,
                start=0,
                length=len(first),
                finish_reason="stop",
                reward=TURN_REWARDS[0],
                observation_length=len(observation),
            ),
            TurnRecord(
                index=1,
                start=len(first) + len(observation),
                length=len(second),
                finish_reason="stop",
                reward=TURN_REWARDS[1],
                observation_length=0,
            ),
        ),
        end="done",
    )


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def _model(vocab_size: int, seed: int = 0) -> Qwen2ForCausalLM:
    config = tiny_qwen2_config(vocab_size=vocab_size)
    config.initializer_range = INITIALIZER_RANGE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config)


def _plain_logprobs(model: torch.nn.Module, episode: Episode) -> torch.Tensor:
    """log p(token t | tokens before it) for every response token, from one plain forward."""
    ids = torch.tensor([episode.token_ids])
    logits = model(input_ids=ids).logits[0].float()
    start = len(episode.prompt_token_ids)
    positions = torch.arange(start, ids.shape[1])
    return torch.log_softmax(logits[positions - 1], -1)[
        torch.arange(len(positions)), ids[0, positions]
    ]


def test_the_template_renders_the_episode_whole(tokenizer: PreTrainedTokenizerFast) -> None:
    episode = _reference_episode(tokenizer)
    # up to the "\n" the template writes after the last turn's end, which no turn samples
    whole = _render(tokenizer, CONVERSATION, False)
    assert str(tokenizer.decode(list(episode.token_ids))) + "\n" == whole


def test_pack_takes_the_model_mask_and_explicit_response_lengths(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    episode = _reference_episode(tokenizer)
    single = Episode(
        task_index=1,
        sample_index=0,
        task=episode.task,
        prompt_token_ids=episode.prompt_token_ids,
        response_token_ids=episode.response_token_ids[:3],
        model_mask=(True, True, True),
        logprobs=(-1.0, -1.0, -1.0),
        turns=(
            TurnRecord(
                index=0,
                start=0,
                length=3,
                finish_reason="length",
                reward=0.0,
                observation_length=0,
            ),
        ),
        end="max_turns",
    )
    sequences = pack_episodes([episode, single])
    size = len(episode.response_token_ids)
    assert sequences.response_lengths is not None
    assert sequences.response_lengths.tolist() == [size, 3]
    assert sequences.action_mask[0].tolist() == list(episode.model_mask)
    assert sequences.action_mask[1].tolist() == [True] * 3 + [False] * (size - 3)
    assert sequences.input_ids[0].tolist() == list(episode.token_ids)
    expected = [
        t if m else 0 for t, m in zip(episode.response_token_ids, episode.model_mask, strict=True)
    ]
    assert sequences.action_tokens[0].tolist() == expected


def test_logprobs_of_model_tokens_equal_a_plain_forward_and_observations_get_none(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    model = _model(len(tokenizer))
    episode = _reference_episode(tokenizer)
    sequences = pack_episodes([episode])
    with torch.no_grad():
        got = response_logprobs(model, sequences, temperature=1.0, device=CPU)[0]
        expected = _plain_logprobs(model, episode)
    mask = torch.tensor(episode.model_mask)
    assert got[mask].tolist() == pytest.approx(expected[mask].tolist(), abs=1e-5)
    assert got[~mask].abs().sum() == 0


def _maker(estimator: str, n: int) -> ExperienceMaker:
    return ExperienceMaker(
        engine=None,  # make() never touches the engine
        decode=lambda ids: "",
        reward=None,  # nor the reward
        sampling=SamplingParams(n=n),
        estimator=estimator,
        micro_batch_size=4,
        device=CPU,
    )


def _experience(tokenizer: PreTrainedTokenizerFast, score: float) -> ExperienceBatch:
    episode = _reference_episode(tokenizer)
    # environment rewards at each turn's last token; the reward function's score is added at
    # the last one
    environment = torch.zeros((1, len(episode.response_token_ids)))
    for turn in episode.turns:
        environment[0, turn.start + turn.length - 1] = turn.reward
    batch = EpisodeBatch(
        episodes=(episode,),
        sequences=pack_episodes([episode]),
        engine_logprobs=torch.tensor([episode.logprobs]),
        environment_rewards=environment,
    )
    rewards = batch.token_rewards(torch.tensor([score]))
    return _maker("reinforce", 1).make(
        batch.sequences,
        rewards.sum(-1),
        None,
        None,
        engine_logprobs=batch.engine_logprobs,
        token_rewards=rewards,
    )


def test_turn_rewards_give_each_turn_its_reward_to_go(tokenizer: PreTrainedTokenizerFast) -> None:
    episode = _reference_episode(tokenizer)
    experience = _experience(tokenizer, score=2.0)
    first, second = episode.turns
    advantages = experience.advantages[0]
    # reinforce, gamma 1: a turn's tokens carry its reward and every later one's
    after_second = TURN_REWARDS[1] + 2.0
    assert advantages[: first.length].tolist() == pytest.approx(
        [TURN_REWARDS[0] + after_second] * first.length
    )
    assert advantages[second.start :].tolist() == pytest.approx([after_second] * second.length)
    assert advantages[first.length : second.start].abs().sum() == 0


def test_group_norm_compares_the_episode_sums(tokenizer: PreTrainedTokenizerFast) -> None:
    episodes = [_reference_episode(tokenizer, sample) for sample in range(2)]
    sequences = pack_episodes(episodes)
    rewards = torch.zeros(sequences.action_mask.shape)
    for row, (a, b) in enumerate([(1.0, 0.0), (0.0, 3.0)]):  # sums 1 and 3
        first, second = episodes[row].turns
        rewards[row, first.length - 1] = a
        rewards[row, second.start + second.length - 1] = b
    experience = _maker("group_norm", 2).make(
        sequences, rewards.sum(-1), None, None, token_rewards=rewards
    )
    mask = sequences.action_mask
    # (1 - 2) / std and (3 - 2) / std with the unbiased std of {1, 3}: -1/sqrt(2), +1/sqrt(2)
    values = [sorted(set(experience.advantages[row][mask[row]].tolist())) for row in range(2)]
    assert values == [pytest.approx([-(0.5**0.5)], rel=1e-4), pytest.approx([0.5**0.5], rel=1e-4)]


@pytest.mark.parametrize("use_tis", [False, True])
def test_observation_tokens_do_not_reach_the_policy_gradient(
    tokenizer: PreTrainedTokenizerFast, use_tis: bool
) -> None:
    """The trainer's loss on the holey layout has the gradients of the same loss over a tensor
    that holds the model's tokens only."""
    episode = _reference_episode(tokenizer)
    experience = _experience(tokenizer, score=2.0)
    config = TrainConfig(
        pretrain="m",
        prompt_data="d",
        reward_fn="a:b",
        use_tis=use_tis,
        entropy_loss_coef=0.01,
        n_samples_per_prompt=1,
        rollout_batch_size=1,
        train_batch_size=1,
        micro_train_batch_size=1,
        micro_rollout_batch_size=1,
        advantage_estimator="reinforce",
    )
    update = PolicyUpdate.from_config(config, world_size=1)
    model = _model(len(tokenizer), seed=1)
    loss, _ = update.micro_batch_loss(model, experience, CPU)
    torch.autograd.backward(loss)
    got = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    mask = torch.tensor(episode.model_mask)
    logprobs = _plain_logprobs(model, episode)[mask][None]
    logits = model(input_ids=torch.tensor([episode.token_ids])).logits[0].float()
    start = len(episode.prompt_token_ids)
    positions = torch.arange(start, len(episode.token_ids))[mask] - 1
    probabilities = torch.softmax(logits[positions], -1)
    entropy = -(probabilities * torch.log_softmax(logits[positions], -1)).sum(-1).mean()
    engine = torch.tensor([episode.logprobs])[:, mask] if use_tis else None
    reference = (
        policy_losses.get("ppo")
        .fn(
            PolicyLossInputs(
                logprobs=logprobs,
                old_logprobs=logprobs.detach(),
                advantages=experience.advantages[:, mask],
                action_mask=torch.ones_like(logprobs, dtype=torch.bool),
                engine_logprobs=engine,
            ),
            config.policy_loss_config(),
        )
        .loss
        - 0.01 * entropy
    )
    torch.autograd.backward(reference)
    assert got.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None
        torch.testing.assert_close(got[name], parameter.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert float(loss.detach()) == pytest.approx(float(reference.detach()), rel=1e-5)


def test_the_replay_buffer_keeps_the_holes_and_the_response_lengths(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """A micro-batch holds whole responses: trimming to the model-token count (the mask's sum)
    would cut the last turn of an episode with observations."""
    experience = _experience(tokenizer, score=1.0)
    buffer = ReplayBuffer(seed=0)
    buffer.append(experience)
    (micro,) = list(buffer.micro_batches(4, epoch=0))
    torch.testing.assert_close(micro.sequences.action_mask, experience.sequences.action_mask)
    torch.testing.assert_close(micro.advantages, experience.advantages)
    assert micro.engine_logprobs is not None
    assert experience.engine_logprobs is not None
    torch.testing.assert_close(micro.engine_logprobs, experience.engine_logprobs)
    assert micro.sequences.response_lengths is not None
    assert micro.sequences.response_lengths.tolist() == [experience.sequences.action_mask.shape[1]]
