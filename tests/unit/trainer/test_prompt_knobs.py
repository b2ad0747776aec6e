"""The prompt knobs as the trainer's builder reads them (:func:`lrft.trainer.prompts.load_prompts`):
the system prompt in the rendered prompt, several sources mixed by their probabilities, and the
training and held-out splits of a ``datasets`` folder."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import torch.distributed as dist
from transformers import PreTrainedTokenizerBase

from lrft.api.errors import ConfigError
from lrft.cli import main
from lrft.config import TrainConfig
from lrft.demos.model import ASSETS_DIR
from lrft.demos.tokenizer import build_tokenizer
from lrft.trainer.prompts import eval_prompts, load_prompts
from tests.trainer.fixtures import make_model_folder

ROLES_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
"""A chat template that shows each message's role, so a test reads the conversation back."""


def _tokenizer() -> PreTrainedTokenizerBase:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = ROLES_TEMPLATE
    return tokenizer


def _jsonl(path: Path, prompts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p, "answer": "0"}) + "\n" for p in prompts))
    return path


def _config(**settings: object) -> TrainConfig:
    return TrainConfig(
        pretrain="m",
        reward_fn="math",
        input_key="prompt",
        reference_key="answer",
        **settings,  # type: ignore[arg-type]  # each test's own settings
    )


def test_the_system_prompt_opens_each_rendered_prompt(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "p.jsonl", ["1+2=", "3+4="])
    plain = _config(prompt_data=str(data), apply_chat_template=True)
    told = _config(prompt_data=str(data), apply_chat_template=True, system_prompt="be brief")
    loaded = {
        name: load_prompts(config, config.prompt_sources, _tokenizer(), limit=None, split=None)
        for name, config in (("plain", plain), ("told", told))
    }
    assert [s.prompt_text for s in loaded["plain"]] == ["[user]1+2=", "[user]3+4="]
    assert [s.prompt_text for s in loaded["told"]] == [
        "[system]be brief[user]1+2=",
        "[system]be brief[user]3+4=",
    ]
    tokens = _tokenizer()("[system]be brief[user]1+2=", add_special_tokens=False)["input_ids"]
    assert list(loaded["told"].samples[0].prompt_token_ids) == tokens


@pytest.mark.parametrize(("probs", "expected"), [((0.75, 0.25), (15, 5)), ((0.5, 0.5), (10, 10))])
def test_mixed_sources_give_each_its_share_of_the_prompts(
    tmp_path: Path, probs: tuple[float, float], expected: tuple[int, int]
) -> None:
    # 12 + 8 prompts: the mix keeps the total and gives each source its probability's share
    first = _jsonl(tmp_path / "a.jsonl", [f"a{i}=" for i in range(12)])
    second = _jsonl(tmp_path / "b.jsonl", [f"b{i}=" for i in range(8)])
    config = _config(prompt_data=f"{first},{second}", prompt_data_probs=",".join(map(str, probs)))
    mixed = load_prompts(
        config, config.prompt_sources, _tokenizer(), limit=None, split=None, probs=probs
    )
    counts = Counter(sample.prompt_text[0] for sample in mixed)
    assert (counts["a"], counts["b"]) == expected
    unmixed = _config(prompt_data=f"{first},{second}")
    both = load_prompts(unmixed, unmixed.prompt_sources, _tokenizer(), limit=None, split=None)
    assert Counter(s.prompt_text[0] for s in both) == {"a": 12, "b": 8}


def test_prompt_split_and_eval_split_pick_the_folders_splits(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "gsm"
    splits = {
        name: datasets.Dataset.from_dict({"prompt": prompts, "answer": ["0"] * len(prompts)})
        for name, prompts in {
            "train": ["t1=", "t2="],
            "test": ["e1="],
            "extra": ["x1=", "x2=", "x3="],
        }.items()
    }
    datasets.DatasetDict(splits).save_to_disk(str(folder))

    def texts(config: TrainConfig) -> tuple[list[str], list[str] | None]:
        train = load_prompts(
            config, config.prompt_sources, _tokenizer(), limit=None, split=config.prompt_split
        )
        held_out = eval_prompts(config, _tokenizer())
        return [s.prompt_text for s in train], (
            None if held_out is None else [s.prompt_text for s in held_out]
        )

    assert texts(_config(prompt_data=str(folder))) == (["t1=", "t2="], None)
    assert texts(_config(prompt_data=str(folder), eval_split="test")) == (["t1=", "t2="], ["e1="])
    assert texts(_config(prompt_data=str(folder), prompt_split="extra", eval_split="train")) == (
        ["x1=", "x2=", "x3="],
        ["t1=", "t2="],
    )


def test_each_comma_separated_source_must_exist_on_its_own(tmp_path: Path) -> None:
    # the start-up check looks at each source, not at the comma-joined string
    first = _jsonl(tmp_path / "a.jsonl", ["1+1="])
    second = _jsonl(tmp_path / "b.jsonl", ["2+2="])
    model = str(make_model_folder(tmp_path / "model"))
    TrainConfig(pretrain=model, reward_fn="math", prompt_data=f"{first},{second}").validate_inputs()
    missing = tmp_path / "c.jsonl"
    config = TrainConfig(pretrain=model, reward_fn="math", prompt_data=f"{first},{missing}")
    with pytest.raises(ConfigError, match=rf"--prompt_data '{re.escape(str(missing))}': no such"):
        config.validate_inputs()


def test_a_system_prompt_the_chat_template_refuses_stops_the_cli_before_any_process_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The demo model's template raises on any role but "user" (it has no system role).
    data = _jsonl(tmp_path / "p.jsonl", ["1+2="])
    argv = [
        "train",
        f"--pretrain={ASSETS_DIR}",
        f"--prompt_data={data}",
        "--input_key=prompt",
        "--reference_key=answer",
        "--reward_fn=lrft.demos:exact_answer",
        "--apply_chat_template",
        "--system_prompt=Be brief.",
        f"--save_path={tmp_path / 'out'}",
    ]
    assert main(argv) == 2
    assert not (tmp_path / "out").exists()  # refused before the outputs were claimed
    assert capsys.readouterr().err.splitlines() == [
        "lrft: configuration error: --system_prompt is set, but the model's chat "
        "template cannot take a system message: it raised TemplateError: the demo model knows "
        "only user messages, got system; drop --system_prompt, or write the instructions into "
        "--input_template instead"
    ]
    assert not dist.is_initialized()
