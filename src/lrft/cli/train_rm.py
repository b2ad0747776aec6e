"""``lrft train-rm``: reward-model training from the command line, one flag per
:class:`~lrft.rm.RMTrainConfig` field of the same name.

Runs as one process (``lrft train-rm ...``) or under torchrun (``torchrun --nproc_per_node N -m
lrft train-rm ...``). ``--config`` reads a JSON or YAML file of the same keys (the command line
wins). The config, the model folder and every row of the data are checked before any process
group starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from lrft.api.errors import ConfigError, LrftError
from lrft.cli.config_file import read_keys
from lrft.rewards.judge_template import JUDGE_TEMPLATES
from lrft.rm.config import LR_SCHEDULES, RMTrainConfig

DESCRIPTION = (
    "Train a reward model. Scalar (default): Bradley-Terry on preference pairs (prompt, chosen, "
    "rejected, optional margin), exported as a one-label sequence-classification folder that "
    "lrft train --reward_pretrain loads. Generative (--generative): supervised training of a judge "
    "on (prompt, response, verdict) rows rendered with a judge template, exported as a causal-LM "
    "folder that lrft train --grm_pretrain judges with. Process (--step_separator TEXT): a "
    "one-label token-classification head learns each step's label at the step's last token, "
    "exported as the folder lrft train --prm_pretrain loads. With no --pretrain: the built-in demo "
    "(a scalar RM on the demo model, from synthetic addition preferences). docs/reward-models.md."
)


@attrs.frozen(kw_only=True)
class RMFlag:
    name: str
    kind: Callable[[str], Any]
    help: str
    choices: Sequence[str] | None = None
    metavar: str | None = None


def _optional_int(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


RM_FLAGS: tuple[RMFlag, ...] = (
    RMFlag(
        name="pretrain",
        kind=str,
        help="model folder to start from: a causal LM (scalar: a new score head) or a reward "
        "model (default: the built-in demo)",
    ),
    RMFlag(
        name="dataset", kind=str, help="training rows: .jsonl/.json/.parquet or datasets folder"
    ),
    RMFlag(
        name="eval_dataset",
        kind=str,
        help="held-out rows: loss and accuracy at every --eval_steps and at the end",
    ),
    RMFlag(name="max_samples", kind=int, help="read only the first N training rows"),
    RMFlag(name="eval_max_samples", kind=int, help="read only the first N held-out rows"),
    RMFlag(name="prompt_key", kind=str, help="column holding the prompt (default: prompt)"),
    RMFlag(
        name="chosen_key", kind=str, help="column holding the preferred response (default: chosen)"
    ),
    RMFlag(
        name="rejected_key", kind=str, help="column holding the other response (default: rejected)"
    ),
    RMFlag(
        name="margin_key",
        kind=str,
        help="column of per-pair margins: the loss asks r_chosen - r_rejected to exceed it",
    ),
    RMFlag(
        name="apply_chat_template",
        kind=bool,
        help="scalar: format prompts with the tokenizer's chat template (as lrft train does); "
        "generative: wrap judge prompts in the judge's chat template (as --grm_apply_chat_template)",
    ),
    RMFlag(name="input_template", kind=str, help="template with one {} for the prompt text"),
    RMFlag(
        name="max_len", kind=int, help="drop (and count) examples with more tokens; never truncates"
    ),
    RMFlag(
        name="generative",
        kind=bool,
        help="train a judge on (prompt, response, verdict) rows instead of a scalar RM",
    ),
    RMFlag(
        name="response_key",
        kind=str,
        help="generative: column holding the judged response (default: response)",
    ),
    RMFlag(
        name="verdict_key",
        kind=str,
        help="generative: column holding the judge's verdict text (default: verdict)",
    ),
    RMFlag(
        name="reference_key",
        kind=str,
        help="generative: column holding the reference answer, for templates that show it",
    ),
    RMFlag(
        name="grm_template",
        kind=str,
        metavar="NAME|FILE",
        help=f"generative: the judge template ({', '.join(JUDGE_TEMPLATES)}, or a JSON/YAML "
        "file; default pointwise-boxed); give lrft train the same",
    ),
    RMFlag(
        name="step_separator",
        kind=str,
        metavar="TEXT",
        help="train a process reward model on step-labelled rows (prompt, steps, labels) "
        "instead: the steps joined by TEXT are the response, each step's label is learnt at its "
        "last token; give lrft train --prm_step_separator the same",
    ),
    RMFlag(
        name="steps_key",
        kind=str,
        help="process: column holding each row's list of steps (default: steps)",
    ),
    RMFlag(
        name="step_labels_key",
        kind=str,
        help="process: column holding one label per step, 1 right, 0 wrong (default: labels)",
    ),
    RMFlag(
        name="train_batch_size",
        kind=int,
        help="pairs (or judge examples) per optimizer step (default 32)",
    ),
    RMFlag(
        name="micro_train_batch_size",
        kind=int,
        help="examples per forward on each rank (default 8)",
    ),
    RMFlag(name="max_epochs", kind=int, help="passes over the training rows (default 1)"),
    RMFlag(name="max_steps", kind=_optional_int, help="stop after N optimizer steps"),
    RMFlag(name="learning_rate", kind=float, help="AdamW learning rate (default 1e-5)"),
    RMFlag(
        name="lr_scheduler",
        kind=str,
        choices=LR_SCHEDULES,
        help="after the warm-up: constant, or linear / cosine decay to 0 at the last step",
    ),
    RMFlag(name="lr_warmup_steps", kind=int, help="linear warm-up steps (default 0)"),
    RMFlag(name="l2", kind=float, help="AdamW weight decay (default 0)"),
    RMFlag(name="max_norm", kind=float, help="gradient-norm clip (default 1; 0: off)"),
    RMFlag(
        name="zero_stage",
        kind=_optional_int,
        help="train with DeepSpeed ZeRO 1, 2 or 3 instead of FSDP2",
    ),
    RMFlag(
        name="deepspeed_config",
        kind=str,
        help="a DeepSpeed JSON file merged into the generated config (needs --zero_stage)",
    ),
    RMFlag(name="seed", kind=int, help="seed of the shuffle and of a new score head (default 42)"),
    RMFlag(
        name="save_path",
        kind=str,
        help="output folder: metrics.jsonl, run.json, hf_model/ (default ./lrft_rm_output)",
    ),
    RMFlag(name="ckpt_path", kind=str, help="checkpoint folder (default SAVE_PATH/checkpoints)"),
    RMFlag(name="save_steps", kind=int, help="checkpoint every N steps (default -1: never)"),
    RMFlag(name="max_ckpt_num", kind=int, help="checkpoints of this run kept (default 3)"),
    RMFlag(
        name="load_checkpoint",
        kind=bool,
        help="resume from the newest checkpoint; its settings must match but for the run's "
        "length, paths, checkpoint and evaluation settings",
    ),
    RMFlag(
        name="overwrite_output",
        kind=bool,
        help="start a new run over another run's outputs, removing exactly those first",
    ),
    RMFlag(
        name="eval_steps",
        kind=int,
        help="evaluate every N steps (default -1: at the start and end only)",
    ),
    RMFlag(
        name="collective_timeout_s", kind=float, help="seconds a collective may wait (default 600)"
    ),
)


def add_train_rm_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``train-rm`` to the ``lrft`` sub-command parsers."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "train-rm", help="train a scalar or generative reward model", description=DESCRIPTION
    )
    parser.add_argument(
        "--config", type=Path, default=None, help="a JSON or YAML file of these same keys"
    )
    for flag in RM_FLAGS:
        name = f"--{flag.name}"
        if flag.kind is bool:
            parser.add_argument(
                name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=flag.help,
            )
        else:
            parser.add_argument(
                name,
                type=flag.kind,
                choices=flag.choices,
                default=argparse.SUPPRESS,
                metavar=flag.metavar,
                help=flag.help,
            )
    return parser


def config_from_args(argv: Sequence[str]) -> RMTrainConfig:
    """``lrft train-rm ...`` arguments (``argv`` starts with ``train-rm``) as a validated config."""
    parser = argparse.ArgumentParser(prog="lrft")
    add_train_rm_parser(parser.add_subparsers(dest="command", required=True))
    args = vars(parser.parse_args(list(argv)))
    args.pop("command")
    config_file = args.pop("config")
    values = (
        read_keys(config_file, {flag.name for flag in RM_FLAGS}) if config_file is not None else {}
    )
    values.update(args)
    if values.get("pretrain") is None:
        from lrft.rm.demo import DEMO_RM_SETTINGS

        values = {**DEMO_RM_SETTINGS, **values}
    try:
        return RMTrainConfig(**values)
    except TypeError as error:  # a value of the wrong type in a config file
        raise ConfigError(f"invalid configuration: {error}") from error


def train_rm_main(argv: Sequence[str]) -> int:
    from lrft.cli import _single_process_env
    from lrft.cli.bench import _free_port

    rank = os.environ.get("RANK", "0")
    try:
        config = config_from_args(argv)
        config.validate_world(int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as error:
        print(f"lrft train-rm: configuration error: {error}", file=sys.stderr)
        return 2
    if "RANK" not in os.environ:
        # One process: any free port for its 1-rank group, so two runs can go side by side.
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    _single_process_env()
    from lrft.rm.build import build_rm_trainer

    try:
        result = build_rm_trainer(config).fit()
    except ConfigError as error:
        print(
            f"lrft train-rm: rank {rank}: configuration error: {error}", file=sys.stderr, flush=True
        )
        return 2
    except (LrftError, RuntimeError, OSError) as error:
        print(
            f"lrft train-rm: rank {rank} failed: {type(error).__name__}: {error}",
            file=sys.stderr,
            flush=True,
        )
        raise
    if rank == "0" and result.last_eval:
        headline = {k: v for k, v in result.last_eval.items() if "accuracy" in k}
        shown = ", ".join(f"{k} {v:.3f}" for k, v in headline.items())
        print(f"done: {result.steps} steps in {result.seconds:.0f}s; {shown}", flush=True)
    return 0
