"""Multi-turn episodes on the real hf engine: the engine's logprobs of every model token equal a
plain transformers forward over the whole final sequence, which holds only if each turn was
generated from exactly the tokens the episode keeps (earlier turns reused as sampled)."""

from __future__ import annotations

import attrs
import torch
from transformers import Qwen2ForCausalLM

from lrft.agents import run_episodes
from lrft.api import EpisodeBudget, EpisodeStart, EpisodeTask, ModelTurn, SamplingParams, StepResult
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.testing.models import INITIALIZER_RANGE, tiny_qwen2_config
from tests.unit.agents._tokenizer import build_tokenizer


def _model(vocab_size: int) -> Qwen2ForCausalLM:
    config = tiny_qwen2_config(vocab_size=vocab_size)
    config.initializer_range = INITIALIZER_RANGE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    torch.nn.Module.eval(model)
    return model


@attrs.define
class EchoEnv:
    """A chat-shaped observation after every turn; never done (the turn budget ends it)."""

    prompt: tuple[int, ...]
    observation: tuple[int, ...]

    def reset(self, task: EpisodeTask) -> EpisodeStart:
        return EpisodeStart(prompt_token_ids=self.prompt)

    def step(self, turn: ModelTurn) -> StepResult:
        return StepResult(observation_token_ids=self.observation)


def test_engine_logprobs_match_a_forward_over_the_whole_episode() -> None:
    tokenizer = build_tokenizer()
    vocab = len(tokenizer)
    engine = HFRolloutEngine(_model(vocab), config=HFEngineConfig(device="cpu"))
    prompt = tuple(tokenizer.encode("<|im_start|>user\nwhat is the answer<|im_end|>\n"))
    observation = tuple(tokenizer.encode("<|im_end|>\n<|im_start|>user\nthe result<|im_end|>\n"))
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=3, return_logprobs=True)
    episodes = run_episodes(
        [EpisodeTask(prompt="a"), EpisodeTask(prompt="b")],
        lambda _: EchoEnv(prompt, observation),
        engine.generate,
        params,
        EpisodeBudget(max_turns=3, max_total_tokens=120),
    )
    reference = _model(vocab)
    for episode in episodes:
        assert episode.end == "max_turns"
        assert len(episode.turns) == 3
        ids = torch.tensor([episode.token_ids])
        with torch.no_grad():
            logits = reference(input_ids=ids).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        offset = len(episode.prompt_token_ids)
        positions = [offset + i for i, m in enumerate(episode.model_mask) if m]
        expected = torch.stack([logprobs[p - 1, episode.token_ids[p]] for p in positions])
        assert episode.logprobs is not None
        got = torch.tensor(
            [lp for lp, m in zip(episode.logprobs, episode.model_mask, strict=True) if m]
        )
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
        assert all(
            lp == 0.0 for lp, m in zip(episode.logprobs, episode.model_mask, strict=True) if not m
        )
    # the two samples of a group are distinct samples of one prompt
    assert episodes[0].turn_token_ids(0) != episodes[1].turn_token_ids(0)
