"""LightRFT's flags under ``lrft train``: its switches in their lrft spelling, a one-line hint
for every flag lrft reads otherwise, and no value of a switch or an unknown flag ever shown."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from lrft.api.errors import ConfigError
from lrft.cli import config_from_args, main
from lrft.cli.flags import FLAGS
from lrft.cli.lightrft import ALIASES, HINTS, SWITCH_HINTS
from tests.unit.trainer.config_errors import config_problems

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]
DOCS = Path(__file__).resolve().parents[3] / "docs" / "lightrft-migration.md"
SECRET = "wandb-key-7f3a9c"


def test_lightrfts_switches_mean_the_same_here() -> None:
    fsdp = config_from_args([*MODEL, "--fsdp", "--fsdp_cpu_offload"])
    assert (fsdp.train_backend_name, fsdp.fsdp_cpu_offload) == ("fsdp2", True)
    awake = config_from_args(["train", "--disable_engine_sleep"])
    assert awake.enable_engine_sleep is False  # the demo's own default is to sleep
    assert config_from_args(["train"]).enable_engine_sleep is True


def test_fsdp_is_no_prefix_and_refuses_zero_stage() -> None:
    with pytest.raises(
        ConfigError, match=r"'fsdp2' \(LightRFT's --fsdp\) .* zero_stage 3 .* choose"
    ):
        config_from_args([*MODEL, "--fsdp", "--zero_stage=3"])
    # prefixes of lrft's own flags are unknown flags, never abbreviations
    with pytest.raises(ConfigError, match=r"unknown flag --fsdp_cpu \(values not shown"):
        config_from_args([*MODEL, "--fsdp_cpu"])
    with pytest.raises(ConfigError, match=r"--eval_data: lrft's --eval_dataset"):
        config_from_args([*MODEL, "--eval_data", "held_out.jsonl"])


@pytest.mark.parametrize(
    "argv",
    [
        ["--use_wandb", SECRET],
        [f"--use_wandb={SECRET}"],
        ["--no-use_wandb", SECRET],
        ["--use_tensorboard", SECRET],
        ["--fsdp", SECRET],
        ["--unknown_api_key", SECRET],
        [f"--unknown_api_key={SECRET}"],
        ["--rm_use_engine", SECRET],
        ["--reward_pretrain", "{" + SECRET + "}"],
    ],
)
def test_a_value_after_a_switch_or_an_unknown_flag_is_never_shown(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*MODEL, *argv]) == 2
    err = capsys.readouterr().err
    config_problems(err)  # one message
    assert SECRET not in err
    assert "configuration error" in err


def test_a_value_given_to_use_wandb_says_where_the_key_goes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*MODEL, "--use_wandb", SECRET, "--wandb_project=p"]) == 2
    err = capsys.readouterr().err
    assert "--use_wandb is a switch and takes no value (the value is not shown" in err
    assert "WANDB_API_KEY" in err
    assert "--wandb_project" in err


def test_every_hint_of_a_command_line_is_in_its_one_message() -> None:
    with pytest.raises(ConfigError) as refused:
        config_from_args([*MODEL, "--bf16", "--save_interval", "1", "--text_only", "--oops", "x"])
    starts = ("--bf16: lrft computes", "--save_interval: lrft checkpoints every --save_steps",
              "--text_only:", "unknown flag --oops")  # fmt: skip
    assert len(refused.value.problems) == len(starts)
    for problem, start in zip(refused.value.problems, starts, strict=True):
        assert problem.startswith(start)
        assert f"{len(starts)} problems" in str(refused.value)
        assert problem in str(refused.value)


def test_sglang_gets_a_hint_rather_than_a_bare_unknown_name() -> None:
    with pytest.raises(ConfigError, match=r"--engine_type sglang: lrft has no SGLang engine yet"):
        config_from_args([*MODEL, "--engine_type", "sglang"])


def test_no_hint_shadows_an_lrft_flag_and_each_names_flags_that_exist() -> None:
    names = {flag.name for flag in FLAGS}
    shadowed = sorted((set(HINTS) | set(ALIASES)) & names)
    assert shadowed == [], f"hints for flags lrft now has (remove them): {shadowed}"
    assert set(SWITCH_HINTS) <= {f.name for f in FLAGS if f.kind is bool}
    spelled = set(ALIASES) | names | {f"no-{n}" for n in names} | set(HINTS)
    texts = [*HINTS.values(), *SWITCH_HINTS.values(), *(a.meaning for a in ALIASES.values())]
    for alias in ALIASES.values():
        texts.extend(alias.argv)
    for text in texts:
        for flag in re.findall(r"--([a-z][a-z0-9_-]*)", text):
            assert flag in spelled, f"{text!r} names --{flag}, which lrft does not have"


def test_the_migration_table_lists_every_lightrft_flag() -> None:
    table = DOCS.read_text()
    rows = set(re.findall(r"^\| `--([a-z0-9_]+)", table, flags=re.MULTILINE))
    documented = set(ALIASES) | set(HINTS)
    assert documented - rows == set(), f"missing from {DOCS.name}: {sorted(documented - rows)}"


def test_the_pages_sample_output_is_what_the_cli_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    block = DOCS.read_text().split("```console\n", 1)[1].split("```", 1)[0].splitlines()
    command, *printed = block
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setattr("lrft.extras.math_verify_available", lambda: True)  # a line of its own
    monkeypatch.chdir(tmp_path)  # where the page's model and data folders are not
    argv = [SECRET if word == "$WANDB_API_KEY" else word for word in shlex.split(command)]
    assert argv[:3] == ["$", "lrft", "train"]
    assert main(argv[2:]) == 2
    assert capsys.readouterr().err.splitlines() == printed
