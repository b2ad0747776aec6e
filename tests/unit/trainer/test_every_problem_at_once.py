"""A configuration is checked whole before anything starts, and every problem it has is
reported in one message: its flags, its fields, the rules across them, the optional packages
it needs, the world size, and the model folders, data and templates it names.

The acceptance case is the migration page's GSM8K command line on a machine that has none of
its packages, and then on one that has its model and data, but a chat template without a
system role and no ``test`` split: each run ends in one message that lists every change."""

from __future__ import annotations

import pickle
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch

from lrft.api.errors import ConfigError
from lrft.backends import registry
from lrft.cli import main
from lrft.config import TrainConfig
from lrft.config.problems import Problems, gathering
from lrft.dist import RankInfo
from lrft.trainer.build import prepare_run
from tests.installed import pretend_installed
from tests.trainer.fixtures import make_model_folder
from tests.unit.trainer.config_errors import config_problems

DOCS = Path(__file__).resolve().parents[3] / "docs" / "lightrft-migration.md"
SYSTEM_PROMPT = "Think step by step, then answer in \\boxed{}."


def _config(**changes: Any) -> TrainConfig:
    values: dict[str, Any] = {"pretrain": "m", "prompt_data": "p.jsonl", "reward_fn": "math"}
    return TrainConfig(**{**values, **changes})


def test_one_problem_is_its_own_message_and_several_are_numbered_under_their_count() -> None:
    assert str(ConfigError("a rule")) == "a rule"
    several = ConfigError("first rule", "second rule")
    assert several.problems == ("first rule", "second rule")
    assert str(several) == (
        "2 problems, each to fix before the run can start:\n  1. first rule\n  2. second rule"
    )
    assert pickle.loads(pickle.dumps(several)).problems == several.problems
    with pytest.raises(TypeError):
        ConfigError()


def test_problems_keeps_each_once_and_drops_what_an_earlier_one_broke() -> None:
    problems = Problems()

    def refuse(text: str) -> None:
        raise ConfigError(text)

    def read_missing_file() -> None:
        Path("/no/such/file").read_text()

    with pytest.raises(FileNotFoundError):  # with nothing found yet, a fault of its own
        problems.check(read_missing_file)
    assert problems.check(refuse, "x is wrong") is False
    assert problems.check(refuse, "x is wrong") is False
    assert problems.check(read_missing_file) is False  # now taken as a consequence
    assert problems.check(lambda: None) is True
    assert problems.found == ("x is wrong",)
    with pytest.raises(ConfigError, match=r"^x is wrong$"):
        problems.raise_any()


def test_a_config_raises_every_rule_across_its_fields_together() -> None:
    with pytest.raises(ConfigError) as refused:
        _config(wandb_project="p", min_lr_ratio=0.1, lr_scheduler="constant")
    texts = refused.value.problems
    assert len(texts) == 2, texts
    assert texts[0].startswith("wandb_project 'p' needs use_wandb")
    assert texts[1].startswith("min_lr_ratio 0.1 is the floor of a decaying schedule")


def test_gathering_reports_invalid_fields_with_the_rules_and_without_their_echoes() -> None:
    with gathering() as problems:
        _config(rollout_batch_size=-1, micro_train_batch_size=0, wandb_project="p")
    assert problems.found == (
        "rollout_batch_size must be a positive integer, got -1",
        "micro_train_batch_size must be a positive integer, got 0",
        "wandb_project 'p' needs use_wandb (without it nothing is logged to W&B)",
    )  # and not train_batch_size's rule, which reads both invalid sizes
    # outside a gathering block, an invalid field raises at once, alone
    with pytest.raises(ConfigError, match=r"^rollout_batch_size must be a positive integer"):
        _config(rollout_batch_size=-1, wandb_project="p")


def _migrated_line() -> list[str]:
    """The migration page's migrated GSM8K command line, after ``-m lrft train``."""
    section = DOCS.read_text().split("## A migrated command line", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert block
    line = block.group(1).replace("\\\n", " ").replace("$SYSTEM_PROMPT", SYSTEM_PROMPT)
    return ["train", *shlex.split(line.split("-m lrft train", 1)[1])]


@pytest.fixture
def fresh_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The working folder of a machine with none of the line's optional packages, under
    torchrun with 2 ranks."""
    pretend_installed(monkeypatch, wandb=False, vllm=False, math_verify=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.chdir(tmp_path)
    return tmp_path


PACKAGES = (
    "engine_type 'vllm' needs the vllm package, which is not installed: pip install 'lrft[vllm]'",
    "use_wandb needs the wandb package, which is not installed: pip install 'lrft[wandb]'",
    "--reward_fn math needs the math-verify package, which is not installed: "
    "pip install 'lrft[rewards]'",
)


def test_the_migrated_gsm8k_line_names_its_packages_model_and_data_in_one_message(
    fresh_machine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_migrated_line()) == 2
    problems = config_problems(capsys.readouterr().err)
    assert problems == [
        *PACKAGES,
        "--pretrain './Qwen2.5-0.5B-Instruct': no such folder (expected a Hugging Face model "
        "folder (config.json, weights, tokenizer files))",
        "--prompt_data './gsm8k': no such file or folder (prompt data is read from local JSONL, "
        "JSON or Parquet files or a datasets folder)",
    ]
    assert list(fresh_machine.iterdir()) == []  # nothing started, nothing written


def test_with_its_model_and_data_there_the_line_names_the_template_and_the_split_too(
    fresh_machine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    datasets = pytest.importorskip("datasets")
    model = make_model_folder(fresh_machine / "Qwen2.5-0.5B-Instruct")
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] != 'system' %}{{ m['content'] }}{% endif %}"
        "{% endfor %}"
    )
    rows = [{"prompt": "1+1?", "label": "math", "reference": "2"}]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk("gsm8k")
    before = sorted(path.name for path in fresh_machine.iterdir())
    capsys.readouterr()  # the saving bars

    assert main(_migrated_line()) == 2
    problems = config_problems(capsys.readouterr().err)
    assert problems[:3] == list(PACKAGES)
    assert problems[3] == (
        "--eval_split 'test': split 'test' is not in './gsm8k'; its splits are train"
    )
    assert problems[4].startswith(
        "--system_prompt is set, but the model's chat template drops system messages"
    )
    assert len(problems) == 5, problems
    assert sorted(path.name for path in fresh_machine.iterdir()) == before


def test_the_packages_a_backend_declares_in_the_registry_are_checked_with_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pretend_installed(monkeypatch, deepspeed=False, vllm=False)
    registry.register(
        "sync",
        "needs-a-package",
        "lrft.backends.sync.direct:DirectSync",
        extra="somewhere",
        packages=("lrft_test_absent_module",),
    )
    with pytest.raises(ConfigError) as refused:
        _config(zero_stage=3, engine_type="vllm", weight_sync="needs-a-package")
    assert refused.value.problems == (
        "engine_type 'vllm' needs the vllm package, which is not installed: "
        "pip install 'lrft[vllm]'",
        "train_backend 'deepspeed' needs the deepspeed package, which is not installed: "
        "pip install 'lrft[deepspeed]'",
        "weight_sync 'needs-a-package' needs the lrft_test_absent_module package, which is not "
        "installed: pip install 'lrft[somewhere]'",
    )
    pretend_installed(monkeypatch, deepspeed=True, vllm=True, lrft_test_absent_module=True)
    assert _config(zero_stage=3, engine_type="vllm").zero_stage == 3


def test_a_run_checked_whole_is_not_read_again_by_the_trainer(tmp_path: Path) -> None:
    model = make_model_folder(tmp_path / "model")
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] != 'system' %}{{ m['content'] }}{% endif %}"
        "{% endfor %}"
    )
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    config = _config(
        pretrain=str(model),
        prompt_data=str(prompts),
        reward_fn="lrft.demos:exact_answer",
        system_prompt="Be brief.",
        apply_chat_template=True,
        input_key="prompt",
        save_path=str(tmp_path / "out"),
    )
    info = RankInfo(
        rank=0, local_rank=0, world_size=1, local_world_size=1, device=torch.device("cpu")
    )
    with pytest.raises(ConfigError, match=r"^--system_prompt is set"):
        prepare_run(config, info)
    prepare_run(config, info, checked=True)  # lrft train's whole check found it already
