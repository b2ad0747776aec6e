"""The command lines of LightRFT's FAQ, of its GSM8K GRPO example and of its on-policy
distillation under ``lrft train``: each either runs with the same meaning or fails with one line
that names the lrft flag to use, and a value given to a switch (LightRFT's ``--use_wandb`` takes
the W&B API key) is never shown."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from lrft.api.errors import ConfigError
from lrft.cli import config_from_args, main
from lrft.run import checkpoint as ckpt
from lrft.run.resume import checkpoint_to_resume
from tests.installed import pretend_installed
from tests.unit.trainer.config_errors import config_problems

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]
SECRET = "wandb-key-20c9e1"
TEACHER_URL = "http://127.0.0.1:13141/generate"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "lightrft-migration.md"

RUNS: list[tuple[str, dict[str, object]]] = [
    ("--gradient_checkpointing", {"gradient_checkpointing": True}),
    (
        "--fsdp --fsdp_cpu_offload",
        {"train_backend_name": "fsdp2", "fsdp_cpu_offload": True, "zero_stage": None},
    ),
    ("--zero_stage 3", {"train_backend_name": "deepspeed", "zero_stage": 3}),
    ("--enable_engine_sleep", {"enable_engine_sleep": True}),
    ("--disable_engine_sleep", {"enable_engine_sleep": False}),
    ("--engine_tp_size 1", {"engine_tp_size": 1}),
    ("--engine_type vllm --engine_mem_util 0.4", {"engine_mem_util": 0.4}),
    ("--engine_type vllm --engine_tp_size 2", {"engine_tp_size": 2}),
    ("--save_path ./checkpoints --max_ckpt_num 3", {"save_path": "./checkpoints"}),
    (
        "--use_wandb --wandb_project your-project --wandb_org your-org --wandb_run_name exp-1",
        {"use_wandb": True, "wandb_org": "your-org", "wandb_run_name": "exp-1"},
    ),
    (
        "--lr_warmup_ratio 0.03 --l2 1.0e-2 --kl_estimator k3 --init_kl_coef 0.01",
        {"lr_warmup_ratio": 0.03, "l2": 0.01, "kl_estimator": "k3", "init_kl_coef": 0.01},
    ),
    (
        "--apply_chat_template --system_prompt 'think, then answer in \\boxed{}'",
        {"system_prompt": "think, then answer in \\boxed{}"},
    ),
    # on-policy distillation: LightRFT's estimators and their flags, the teacher as lrft names it
    (
        f"--advantage_estimator on_policy_distillation --opd_kl_coef 0.5 --no_task_reward "
        f"--teacher_url {TEACHER_URL} --teacher_protocol sglang",
        {"uses_teacher": True, "opd_kl_coef": 0.5, "no_task_reward": True},
    ),
    (
        "--advantage_estimator on_policy_distillation_hybrid --teacher_pretrain ./teacher "
        "--use_kl_loss --init_kl_coef 0.01",
        {"advantage_estimator": "on_policy_distillation_hybrid", "use_kl_loss": True},
    ),
]
"""FAQ and example lines that run (with ``--engine_type vllm`` where the FAQ means vLLM's
settings), and fields of the config that say they mean what LightRFT means."""

HINTED: list[tuple[str, str]] = [
    # the FAQ's lines, as written, on lrft's default hf engine
    ("--engine_mem_util 0.4", r"engine 'hf' reserves none .* use engine_type vllm"),
    ("--engine_tp_size 2", r"maximum tensor-parallel size 1 \(--engine_type vllm"),
    ("--reward_running_norm", r"--reward_running_norm: lrft's --normalize_reward"),
    (
        f"--use_wandb {SECRET} --wandb_org your-org --wandb_run_name experiment-1",
        r"--use_wandb is a switch .*WANDB_API_KEY.*--wandb_project",
    ),
    ("--save_interval 1 --max_ckpt_num 3", r"--save_interval: lrft checkpoints every --save_steps"),
    ("--bf16", r"--bf16: lrft computes in bf16 .* by itself"),
    ("--max_eval_samples 1319", r"--max_eval_samples: lrft's --eval_max_samples"),
    ("--engine_type sglang", r"--engine_type sglang: .* --engine_type vllm"),
    ("--reward_pretrain {}", r"--reward_pretrain: lrft takes comma-separated reward-model folders"),
    ("--fsdp --zero_stage 3", r"'fsdp2' \(LightRFT's --fsdp\) .* zero_stage 3 .* choose one"),
    # LightRFT's distillation example passes its SGLang teacher as a reward service
    (
        f"--advantage_estimator on_policy_distillation --remote_rm_url {TEACHER_URL}",
        r"LightRFT passes its SGLang teacher's URL as --remote_rm_url.*"
        r"--teacher_url URL --teacher_protocol sglang",
    ),
]
"""FAQ and example lines that fail, and what their one line says."""

GSM8K_EXAMPLE = (
    "--save_trajectories --advantage_estimator group_norm --fsdp --use_kl_loss --flash_attn "
    "--rm_use_engine --reward_pretrain {} --micro_train_batch_size 4 --train_batch_size 128 "
    "--micro_rollout_batch_size 4 --rollout_batch_size 128 --max_epochs 1 --num_episodes 30 "
    "--lr_warmup_ratio 0.03 --n_samples_per_prompt 5 --prompt_max_len 1024 "
    "--generate_max_len 2048 --zero_stage 3 --bf16 --actor_learning_rate 1e-6 "
    "--init_kl_coef 0.01 --kl_estimator k3 --input_key prompt --label_key label --eval_steps 20 "
    "--eval_split test --max_eval_samples 1319 --apply_chat_template --gradient_checkpointing "
    "--save_steps 20 --max_ckpt_num 3 --engine_type sglang --engine_mem_util 0.6 "
    "--engine_tp_size 2 --enable_engine_sleep --system_prompt 'Think, then answer.' "
    f"--l2 1.0e-2 --freeze_prefix --adam_offload --text_only --use_wandb {SECRET} "
    "--wandb_project P --wandb_run_name R"
)
"""LightRFT's GSM8K GRPO example command line (its model and data paths are ours)."""

GSM8K_HINTED = (
    "--rm_use_engine",
    "--reward_pretrain",
    "--bf16",
    "--max_eval_samples: lrft's --eval_max_samples",
    "--engine_type sglang",
    "--freeze_prefix",
    "--text_only",
    "--use_wandb is a switch",
)


def _argv(line: str) -> list[str]:
    return [*MODEL, *shlex.split(line)]


@pytest.fixture(autouse=True)
def _vllm_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    # the vllm lines check settings, not the package: pretend it is installed
    pretend_installed(monkeypatch, vllm=True)


@pytest.mark.parametrize(("line", "meaning"), RUNS, ids=[line for line, _ in RUNS])
def test_a_lightrft_line_runs_with_the_same_meaning(line: str, meaning: dict[str, object]) -> None:
    config = config_from_args(_argv(line))
    assert {name: getattr(config, name) for name in meaning} == meaning


@pytest.mark.parametrize(("line", "hint"), HINTED, ids=[line for line, _ in HINTED])
def test_a_lightrft_line_fails_with_its_hint(
    line: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=hint) as refused:
        config_from_args(_argv(line))
    assert len(refused.value.problems) == 1
    assert main(_argv(line)) == 2  # with the others the whole check finds (no model 'm')
    err = capsys.readouterr().err
    assert any(re.search(hint, problem) for problem in config_problems(err)), err
    assert SECRET not in err


def test_the_gsm8k_example_names_every_change_in_one_message_without_its_key(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        "importlib.util.find_spec", lambda name: None if name == "flash_attn" else find_spec(name)
    )
    assert main(_argv(GSM8K_EXAMPLE)) == 2
    err = capsys.readouterr().err
    problems = config_problems(err)
    assert SECRET not in err
    # the flags LightRFT reads otherwise, the settings that conflict (--fsdp with --zero_stage),
    # the packages, the world size and the paths that are not there: all at once
    expected = (
        *GSM8K_HINTED,
        "engine_tp_size 2 exceeds engine 'hf''s maximum",
        "'flash_attention_2' (LightRFT's --flash_attn) needs the flash-attn package",
        "train_backend 'fsdp2' (LightRFT's --fsdp) trains with FSDP2, but zero_stage 3",
        "world size 1 is not divisible by engine_tp_size 2",
        "--pretrain 'm': no such folder",
        "--prompt_data 'p.jsonl': no such file",
    )
    for part in expected:
        assert any(part in problem for problem in problems), (part, problems)
    assert len(problems) == len(expected), problems


def test_the_gsm8k_example_migrated_as_its_hints_say_runs_with_its_meaning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    migrated = GSM8K_EXAMPLE
    for old, new in [
        (" --rm_use_engine", ""),
        (" --reward_pretrain {}", ""),
        (" --bf16", ""),
        ("--max_eval_samples", "--eval_max_samples"),
        ("--engine_type sglang", "--engine_type vllm"),
        (" --freeze_prefix", ""),
        (" --text_only", ""),
        (f"--use_wandb {SECRET}", "--use_wandb"),
        (" --fsdp", ""),  # the example sets --zero_stage 3 too, which --fsdp refuses
    ]:
        assert old in migrated, old
        migrated = migrated.replace(old, new)
    migrated = migrated.replace(" --eval_split test", "")  # a jsonl file has no splits
    # --flash_attn selects flash_attention_2, which needs its package (and CUDA), never sdpa
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        "importlib.util.find_spec", lambda name: None if name == "flash_attn" else find_spec(name)
    )
    with pytest.raises(ConfigError, match=r"'flash_attention_2' \(LightRFT's --flash_attn\) needs"):
        config_from_args(_argv(migrated))
    config = config_from_args(_argv(migrated.replace(" --flash_attn", "")))
    assert (config.train_backend_name, config.zero_stage) == ("deepspeed", 3)
    assert (config.rollout_batch_size, config.n_samples_per_prompt) == (128, 5)
    assert (config.prompt_max_len, config.generate_max_len) == (1024, 2048)
    assert (config.lr_warmup_ratio, config.actor_learning_rate) == (0.03, 1e-6)
    assert (config.engine_type, config.engine_tp_size, config.engine_mem_util) == ("vllm", 2, 0.6)
    assert config.system_prompt == "Think, then answer."
    assert (config.use_wandb, config.wandb_project) == (True, "P")


def test_the_faq_resume_line_reads_a_checkpoint_folder_and_refuses_a_lightrft_one(
    tmp_path: Path,
) -> None:
    root = tmp_path / "checkpoints"
    (root / "episode_5" / "_actor").mkdir(parents=True)  # what LightRFT writes
    lightrft = config_from_args(_argv(f"--load_checkpoint --ckpt_path {root / 'episode_5'}"))
    with pytest.raises(ConfigError, match=r"holds no complete lrft checkpoint"):
        checkpoint_to_resume(lightrft)
    (root / "global_step5").mkdir()
    (root / "global_step5" / ckpt.MANIFEST).write_text("{}")
    named = config_from_args(_argv(f"--load_checkpoint --ckpt_path {root / 'global_step5'}"))
    assert checkpoint_to_resume(named) == root / "global_step5"
    assert re.fullmatch(r".*checkpoints", named.checkpoint_dir)


def test_the_distillation_sections_line_prints_what_the_page_says(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    section = DOCS.read_text().split("## On-policy distillation", 1)[1]
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    command, *printed = block.replace("\\\n", " ").splitlines()
    argv = shlex.split(command)
    assert argv[:3] == ["$", "lrft", "train"]
    assert "--remote_rm_url" in argv
    monkeypatch.setattr("lrft.extras.math_verify_available", lambda: True)
    monkeypatch.chdir(tmp_path)  # where the page's model and prompts are not
    assert main(argv[2:]) == 2
    assert capsys.readouterr().err.splitlines() == printed
    # the spelling it names runs with the same teacher service
    renamed = ["--teacher_url" if word == "--remote_rm_url" else word for word in argv[2:]]
    config = config_from_args([*renamed, "--teacher_protocol", "sglang"])
    assert (config.teacher_url, config.teacher_protocol) == (TEACHER_URL, "sglang")
