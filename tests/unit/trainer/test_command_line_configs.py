"""Command lines parse to the settings they spell: each representative line (LightRFT's GSM8K
example as docs/lightrft-migration.md migrates it, flags of several values, negative numbers,
switches turned off, a config file) gives the config built directly from values written here by
hand, field for field."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from lrft.cli import config_from_args
from lrft.cli.eval import settings_from_args
from lrft.cli.train_rm import config_from_args as rm_config_from_args
from lrft.config import TrainConfig
from lrft.eval import EvalSettings
from lrft.rm import RMTrainConfig
from tests.installed import pretend_installed

DOCS = Path(__file__).resolve().parents[3] / "docs" / "lightrft-migration.md"
SYSTEM_PROMPT = "Think step by step, then answer in \\boxed{}."
MODEL: dict[str, object] = {"pretrain": "m", "prompt_data": "p.jsonl", "reward_fn": "math"}


def _migrated_line() -> list[str]:
    """The command line of the migration page's section "A migrated command line", after
    ``-m lrft train``, with ``$SYSTEM_PROMPT`` set."""
    section = DOCS.read_text().split("## A migrated command line", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert block, "no bash block in the migration page's migrated command line"
    line = block.group(1).replace("\\\n", " ").replace("$SYSTEM_PROMPT", SYSTEM_PROMPT)
    return ["train", *shlex.split(line.split("-m lrft train", 1)[1])]


GSM8K = {
    "pretrain": "./Qwen2.5-0.5B-Instruct",
    "prompt_data": "./gsm8k",
    "eval_split": "test",
    "eval_max_samples": 1319,
    "input_key": "prompt",
    "label_key": "label",
    "reference_key": "reference",
    "reward_fn": "math",
    "apply_chat_template": True,
    "system_prompt": SYSTEM_PROMPT,
    "advantage_estimator": "group_norm",
    "use_kl_loss": True,
    "init_kl_coef": 0.01,
    "kl_estimator": "k3",
    "n_samples_per_prompt": 5,
    "rollout_batch_size": 128,
    "train_batch_size": 128,
    "micro_rollout_batch_size": 4,
    "micro_train_batch_size": 4,
    "num_episodes": 30,
    "actor_learning_rate": 1e-6,
    "lr_warmup_ratio": 0.03,
    "lr_scheduler": "cosine_with_min_lr",
    "l2": 0.01,
    "prompt_max_len": 1024,
    "generate_max_len": 2048,
    "train_backend": "fsdp2",  # LightRFT's --fsdp
    "gradient_checkpointing": True,
    "adam_offload": True,
    "engine_type": "vllm",
    "engine_tp_size": 2,
    "engine_mem_util": 0.6,
    "enable_engine_sleep": True,
    "save_path": "results/gsm8k",
    "save_steps": 20,
    "max_ckpt_num": 3,
    "eval_steps": 20,
    "save_trajectories": True,
    "use_wandb": True,
    "wandb_project": "LightRFT-GSM8K",
}

LINES: dict[str, tuple[list[str], dict[str, object]]] = {
    "several values, negative numbers, switches off": (
        [
            *("train", "--pretrain", "/models/m", "--prompt_data=a.jsonl,b.jsonl"),
            *("--prompt_data_probs", "0.7,0.3", "--reward_fn=math", "--reward_pretrain", "r1,r2"),
            *("--reward_weights", "-1,0.5,2", "--adam_betas", "0.9", "0.95"),
            *("--eps_clip_low_high", "0.2", "0.28", "--no-progress_bar", "--max_steps", "none"),
            *("--seed", "-3", "--actor_learning_rate", "3e-6", "--temperature", "0.7"),
            *("--loss_agg_mode", "seq-mean-token-sum", "--advantage_estimator", "gae"),
            *("--critic_learning_rate", "1e-5", "--no-fsdp_reshard_after_forward"),
        ],
        {
            "pretrain": "/models/m",
            "prompt_data": "a.jsonl,b.jsonl",
            "prompt_data_probs": (0.7, 0.3),
            "reward_fn": "math",
            "reward_pretrain": ("r1", "r2"),
            "reward_weights": (-1.0, 0.5, 2.0),
            "adam_betas": (0.9, 0.95),
            "eps_clip_low_high": (0.2, 0.28),
            "progress_bar": False,
            "max_steps": None,
            "seed": -3,
            "actor_learning_rate": 3e-6,
            "temperature": 0.7,
            "loss_agg_mode": "seq-mean-token-sum",
            "advantage_estimator": "gae",
            "critic_learning_rate": 1e-5,
            "fsdp_reshard_after_forward": False,
        },
    ),
    "episodes and LoRA": (
        [
            *("train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"),
            *("--environment=tool_calls", "--tools", "calculator", "python", "--max_turns=3"),
            *('--environment_options={"chat_template": false}', "--lora_rank", "8"),
            *("--target_modules", "q_proj", "v_proj", "--lora_alpha=32", "--max_steps=5"),
        ],
        {
            **MODEL,
            "environment": "tool_calls",
            "tools": ("calculator", "python"),
            "max_turns": 3,
            "environment_options": '{"chat_template": false}',
            "lora_rank": 8,
            "target_modules": ("q_proj", "v_proj"),
            "lora_alpha": 32,
            "max_steps": 5,
        },
    ),
}


@pytest.fixture(autouse=True)
def _optional_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    # these lines check settings, not installed packages
    pretend_installed(monkeypatch, vllm=True)
    monkeypatch.setattr("lrft.extras.wandb_available", lambda: True)


def test_the_migrated_gsm8k_line_of_the_docs_parses_to_its_settings() -> None:
    config = config_from_args(_migrated_line())
    assert config.as_dict() == TrainConfig(**GSM8K).as_dict()  # type: ignore[arg-type]  # a mapping of mixed field values
    assert (config.train_backend_name, config.lr_scheduler) == ("fsdp2", "cosine_with_min_lr")


@pytest.mark.parametrize("name", sorted(LINES))
def test_a_command_line_parses_to_the_config_of_its_values(name: str) -> None:
    argv, values = LINES[name]
    expected = TrainConfig(**values)  # type: ignore[arg-type]  # a mapping of mixed field values
    assert config_from_args(argv).as_dict() == expected.as_dict()


def test_a_config_file_and_the_command_line_over_it(tmp_path: Path) -> None:
    keys = {**MODEL, "n_samples_per_prompt": 2, "reward_pretrain": ["a", "b"], "l2": 0.1}
    (tmp_path / "run.json").write_text(json.dumps({**keys, "adam_betas": [0.9, 0.95]}))
    argv = ["train", "--config", str(tmp_path / "run.json"), "--n_samples_per_prompt", "4"]
    config = config_from_args(argv)
    expected = TrainConfig(
        pretrain="m",
        prompt_data="p.jsonl",
        reward_fn="math",
        n_samples_per_prompt=4,
        reward_pretrain=("a", "b"),
        l2=0.1,
        adam_betas=(0.9, 0.95),
    )
    assert config.as_dict() == expected.as_dict()


def test_a_train_rm_line_parses_to_its_settings() -> None:
    argv = [
        *("train-rm", "--pretrain=m", "--dataset=d.jsonl", "--generative", "--reference_key=ref"),
        *("--grm_template=pairwise-boxed", "--max_steps=none", "--zero_stage=3"),
        *("--deepspeed_config=ds.json", "--lr_scheduler=cosine", "--learning_rate=2e-5"),
        *("--no-apply_chat_template", "--max_len", "512"),
    ]
    expected = RMTrainConfig(
        pretrain="m",
        dataset="d.jsonl",
        generative=True,
        reference_key="ref",
        grm_template="pairwise-boxed",
        max_steps=None,
        zero_stage=3,
        deepspeed_config="ds.json",
        lr_scheduler="cosine",
        learning_rate=2e-5,
        apply_chat_template=False,
        max_len=512,
    )
    assert rm_config_from_args(argv).as_dict() == expected.as_dict()


def test_an_eval_line_parses_to_its_settings_and_the_shared_values() -> None:
    settings, shared = settings_from_args(
        [
            *("eval", "--model=ckpt", "--dataset=d.jsonl", "--split=test", "--no-greedy"),
            *("--n_samples=4", "--pass_k=1,2", "--temperature=0.6", "--reward_pretrain=a,b"),
            *("--seed=-1", "--apply_chat_template", "--generate_max_len", "64"),
        ]
    )
    assert settings == EvalSettings(
        model="ckpt", dataset="d.jsonl", split="test", greedy=False, n_samples=4, ks=(1, 2)
    )
    assert shared == {
        "temperature": 0.6,
        "reward_pretrain": "a,b",
        "seed": -1,
        "apply_chat_template": True,
        "generate_max_len": 64,
    }
