"""The judge and recipe flags of ``lrft train``: bad input (a reward-model folder without a score
head, a judge template without a score slot, a judge that is a classifier, malformed recipes)
is a ``ConfigError`` naming the value and the rule before any process group starts; recipes
weigh each label with its own rewards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lrft.api.errors import ConfigError
from lrft.cli import config_from_args
from lrft.config import TrainConfig
from lrft.rewards import CombinedReward, PerSampleReward, RewardSample, compute_rewards
from lrft.trainer.recipes import read_recipes, recipe_routes
from lrft.trainer.rewards import check_reward_settings
from tests.unit.rm.models import save_with_tokenizer, tiny_classifier, tiny_judge

BASE = ["train", "--pretrain=m", "--prompt_data=p.jsonl"]


def test_a_reward_model_folder_without_a_score_head_is_refused(tmp_path: Path) -> None:
    causal = save_with_tokenizer(tiny_judge(), tmp_path / "causal")
    config = TrainConfig(pretrain="m", prompt_data="p", reward_pretrain=[str(causal)])
    with pytest.raises(
        ConfigError,
        match=r"reward_pretrain '.*causal' is a Qwen2ForCausalLM folder, without a score head: "
        r"a reward model is a \*ForSequenceClassification folder with one label",
    ):
        check_reward_settings(config)
    scalar = save_with_tokenizer(tiny_classifier(), tmp_path / "scalar")
    check_reward_settings(TrainConfig(pretrain="m", prompt_data="p", reward_pretrain=[str(scalar)]))


def test_a_judge_must_generate(tmp_path: Path) -> None:
    scalar = save_with_tokenizer(tiny_classifier(), tmp_path / "scalar")
    config = TrainConfig(pretrain="m", prompt_data="p", grm_pretrain=[str(scalar)])
    with pytest.raises(
        ConfigError, match=r"grm_pretrain '.*scalar' is a Qwen2ForSequenceClassification"
    ):
        check_reward_settings(config)
    with pytest.raises(ConfigError, match=r"grm_pretrain '.*none' is not a model folder"):
        check_reward_settings(
            TrainConfig(pretrain="m", prompt_data="p", grm_pretrain=[str(tmp_path / "none")])
        )


def test_a_judge_template_without_a_score_slot_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "judge.json"
    path.write_text(json.dumps({"prompt": "{prompt}{response}", "verdict": "Score: N"}))
    with pytest.raises(
        ConfigError, match=r"verdict 'Score: N' has 0 \{score\} slots; it must have exactly one"
    ):
        config_from_args([*BASE, "--grm_pretrain=j", f"--grm_template={path}"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--reward_fn=math", "--reference_key=a", "--grm_max_new_tokens=9"],
            r"grm_max_new_tokens applies to grm_pretrain",
        ),
        (
            ["--reward_fn=math", "--reference_key=a", "--grm_unparsable_score=1"],
            r"grm_unparsable_score applies",
        ),
        (
            ["--grm_pretrain=j", "--grm_template=pairwise-boxed"],
            r"shows the judge the reference answer: set --reference_key",
        ),
        (
            ["--grm_pretrain=j", "--grm_unparsable_score=nan"],
            r"grm_unparsable_score must be finite, got nan",
        ),
        (
            ["--grm_pretrain=j", "--reward_weights=1,2"],
            r"2 entries for 1 rewards .*each grm_pretrain",
        ),
        (
            ["--grm_pretrain=j", "--reward_weights=1", "--reward_recipes=r.json"],
            r"reward_recipes gives each label its own weights; reward_weights one set for all",
        ),
    ],
)
def test_judge_settings_are_named(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_args([*BASE, *argv])


def _score(name: str, value: float) -> PerSampleReward:
    return PerSampleReward(name=name, score=lambda sample: value * len(sample.response))


def test_recipes_route_each_label_to_its_weighted_rewards(tmp_path: Path) -> None:
    path = tmp_path / "recipes.yaml"
    path.write_text("math:\n  a: 1.0\n  b: 0.5\nchat:\n  b: 2\n")
    recipes = read_recipes(str(path))
    a, b = _score("a", 1.0), _score("b", 10.0)
    routes = recipe_routes(recipes, [a, b], ["math", "chat"], path=str(path))
    reward = CombinedReward(routes=routes)
    samples = [
        RewardSample(prompt="", response="xy", label="math"),
        RewardSample(prompt="", response="xyz", label="chat"),
    ]
    output = compute_rewards(reward, samples)
    assert output.scores == (1.0 * 2 + 0.5 * 20, 2 * 30.0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"math": {"a": "high"}}',
            r"label 'math', reward 'a': the weight must be a finite number",
        ),
        ('{"math": []}', r"label 'math' must map reward names to weights"),
        ("[]", r"must map labels to \{reward: weight\}"),
        ("{", r"cannot be parsed"),
    ],
)
def test_malformed_recipes_are_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "recipes.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        read_recipes(str(path))
    config = TrainConfig(pretrain="m", prompt_data="p", reward_fn="a:b", reward_recipes=str(path))
    with pytest.raises(ConfigError, match=message):
        check_reward_settings(config)  # before any process group


def test_recipes_must_match_the_rewards_and_the_labels() -> None:
    a, b = _score("a", 1.0), _score("b", 1.0)
    with pytest.raises(
        ConfigError,
        match=r"label 'math' names rewards \['c'\] that are not configured; the rewards are \['a', 'b'\]",
    ):
        recipe_routes({"math": {"a": 1.0, "c": 1.0}}, [a, b], ["math"], path="r")
    with pytest.raises(ConfigError, match=r"uses no recipe for the configured rewards \['b'\]"):
        recipe_routes({"math": {"a": 1.0}}, [a, b], ["math"], path="r")
    with pytest.raises(
        ConfigError,
        match=r"has no recipe for the data labels \['chat'\]; its labels are \['math'\]",
    ):
        recipe_routes({"math": {"a": 1.0, "b": 1.0}}, [a, b], ["math", "chat"], path="r")
