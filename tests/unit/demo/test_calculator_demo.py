"""``lrft train --demo calculator``: the settings it brings (the episodes its model was warmed up
for, each overridable), and the model and 3-digit prompt files it points the run at."""

from __future__ import annotations

import json
from pathlib import Path

from lrft.cli import config_from_args
from lrft.demos.apply import apply_demo_or_preset
from lrft.demos.calculator import ASSETS_DIR, CALCULATOR_TASK


def test_the_demo_brings_its_episodes_and_each_setting_can_be_overridden() -> None:
    config = config_from_args(["train", "--demo", "calculator"])
    assert config.environment == "tool_calls"
    assert config.tools == ("calculator",)
    assert json.loads(str(config.environment_options)) == {"chat_template": False}
    assert (config.max_turns, config.max_episode_tokens, config.generate_max_len) == (2, 64, 40)
    assert (config.max_steps, config.eval_steps, config.eval_max_samples) == (20, 10, 200)
    shorter = config_from_args(["train", "--demo=calculator", "--max_steps=3"])
    assert shorter.max_steps == 3
    # the other demos bring none of it
    assert config_from_args(["train"]).environment is None


def test_the_demo_points_the_run_at_its_model_and_three_digit_sums(tmp_path: Path) -> None:
    argv = ["train", "--demo=calculator", f"--save_path={tmp_path / 'out'}"]
    config = apply_demo_or_preset(config_from_args(argv), rank=0)
    assert config.pretrain == str(ASSETS_DIR)
    assert (ASSETS_DIR / "config.json").is_file()
    assert config.reward_fn == "lrft.demos:exact_answer"
    assert (config.input_key, config.reference_key) == ("input", "answer")
    assert config.prompt_data is not None
    assert config.eval_dataset is not None
    train = [json.loads(line) for line in Path(config.prompt_data).read_text().splitlines()]
    held_out = [json.loads(line) for line in Path(config.eval_dataset).read_text().splitlines()]
    assert (len(train), len(held_out)) == (6000, 500)
    for row in train[:50] + held_out[:50]:
        a, b = (int(x) for x in row["input"].removesuffix("=").split("+"))
        assert 100 <= a <= 999
        assert 100 <= b <= 999
        assert row["answer"] == str(a + b)
    # held out means held out: no held-out sum, nor its swapped twin, is a training prompt
    seen = {row["input"] for row in train}
    for problem in CALCULATOR_TASK.eval_problems():
        assert problem.prompt not in seen
        assert f"{problem.b}+{problem.a}=" not in seen
