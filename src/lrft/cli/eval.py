"""``lrft eval``: evaluate a model folder or a checkpoint on a prompt set, on one process or
under torchrun (``torchrun --nproc_per_node N -m lrft eval ...``).

Its own flags say what to evaluate and report (:class:`~lrft.eval.EvalSettings`); the data,
reward, sampling and engine flags are ``lrft train``'s (:data:`SHARED_FLAGS`, same names and
meaning). docs/eval.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from lrft.api.errors import ConfigError, LrftError
from lrft.cli.flags import FLAGS, Flag
from lrft.cli.lightrft import translate
from lrft.redaction import redact
from lrft.run.progress import limit_library_bars

DESCRIPTION = (
    "Evaluate a Hugging Face folder or an lrft checkpoint on a prompt set with any reward: "
    "greedy accuracy, and with --n_samples N pass@k and mean@N (unbiased pass@k), overall and "
    "per label (--label_key), as a table and a JSON report (--output). Runs under torchrun on "
    "every rank. The data, reward, sampling and engine flags are lrft train's. docs/eval.md."
)

SHARED_FLAGS = (
    "input_key",
    "label_key",
    "reference_key",
    "apply_chat_template",
    "input_template",
    "system_prompt",
    "prompt_max_len",
    "max_samples",
    "reward_fn",
    "reward_pretrain",
    "remote_rm_url",
    "remote_rm_timeout_s",
    "remote_rm_max_attempts",
    "remote_rm_protocol",
    "remote_rm_batch_size",
    "remote_rm_max_concurrency",
    "remote_rm_auth_env",
    "reward_weights",
    "reward_recipes",
    "grm_pretrain",
    "grm_template",
    "grm_max_new_tokens",
    "grm_apply_chat_template",
    "grm_unparsable_score",
    "temperature",
    "top_p",
    "generate_max_len",
    "micro_rollout_batch_size",
    "engine_type",
    "hf_decode",
    "engine_tp_size",
    "engine_mem_util",
    "attn_implementation",
    "seed",
    "plugins",
    "collective_timeout_s",
)
"""The ``lrft train`` flags ``lrft eval`` reads, with the same meaning."""


OWN_VALUED = ("model", "dataset", "split", "n_samples", "pass_k", "correct_above", "output")
"""``lrft eval``'s own flags that take a value (``--greedy`` is its one switch)."""


def _pass_k(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def add_eval_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``eval`` to the ``lrft`` sub-command parsers."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "eval",
        help="evaluate a model or checkpoint: greedy accuracy, pass@k, mean@n, per label",
        description=DESCRIPTION,
        allow_abbrev=False,
    )
    own = parser.add_argument_group("what to evaluate")
    own.add_argument(
        "--model",
        required=True,
        help="a Hugging Face folder, an lrft checkpoint (global_step<k>), or the folder holding "
        "checkpoints (its newest)",
    )
    own.add_argument(
        "--dataset", required=True, help="prompts: .jsonl/.json/.parquet or datasets folder"
    )
    own.add_argument("--split", default=None, help="a DatasetDict folder's split (unset: train)")
    own.add_argument(
        "--greedy",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="score one greedy response per prompt (greedy/accuracy) [default: on]",
    )
    own.add_argument(
        "--n_samples",
        type=int,
        default=0,
        help="responses sampled per prompt at --temperature, for pass@k and mean@N [default: 0]",
    )
    own.add_argument(
        "--pass_k",
        type=_pass_k,
        default=None,
        metavar="K[,K...]",
        help="the pass@k to report, each <= --n_samples [default: 1 and N]",
    )
    own.add_argument(
        "--correct_above",
        type=float,
        default=0.0,
        help="a response counts as correct when its reward exceeds this [default: 0]",
    )
    own.add_argument("--output", default=None, help="write the JSON report here (rank 0)")
    shared = parser.add_argument_group("shared with lrft train (same meaning)")
    by_name = {flag.name: flag for flag in FLAGS}
    for name in SHARED_FLAGS:
        _add_shared(shared, by_name[name])
    return parser


def _add_shared(section: argparse._ArgumentGroup, flag: Flag) -> None:
    text = flag.help.replace("%", "%%")
    if flag.kind is bool:
        section.add_argument(
            f"--{flag.name}",
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=text,
        )
        return
    section.add_argument(
        f"--{flag.name}",
        type=flag.kind,
        choices=flag.choices() if callable(flag.choices) else flag.choices,
        default=argparse.SUPPRESS,
        metavar=flag.metavar,
        nargs=flag.nargs,
        help=text,
    )


def settings_from_args(argv: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    """``lrft eval ...`` as :class:`~lrft.eval.EvalSettings` and the shared settings by name."""
    from lrft.cli import build_parser
    from lrft.eval import EvalSettings

    argv = list(argv)
    if argv[:1] == ["eval"]:
        # lrft train's guard: LightRFT's flags get their hints, and no value of a switch or of
        # an unknown flag is shown (it may be a secret)
        argv = ["eval", *translate(argv[1:], **_flag_names())]
    args = vars(build_parser().parse_args(argv))
    args.pop("command")
    own = {name: args.pop(name) for name in ("model", "dataset", "split", "greedy", "output")}
    n_samples = args.pop("n_samples")
    ks = args.pop("pass_k")
    if ks is None:
        ks = tuple(sorted({1, n_samples})) if n_samples else (1,)
    settings = EvalSettings(
        **own, n_samples=n_samples, ks=ks, correct_above=args.pop("correct_above")
    )
    return settings, args


def _flag_names() -> dict[str, Any]:
    """What :func:`lrft.cli.lightrft.translate` needs to know of ``lrft eval``'s flags."""
    from lrft.backends import registry

    shared = [flag for flag in FLAGS if flag.name in SHARED_FLAGS]
    return {
        "switches": {"greedy", *(f.name for f in shared if f.kind is bool)},
        "valued": {*OWN_VALUED, *(f.name for f in shared if f.kind is not bool)},
        "known_engines": set(registry.entries("rollout")),
    }


def eval_main(argv: Sequence[str]) -> int:
    """``lrft eval``; returns the exit code (2 for a configuration error)."""
    from lrft.cli import _single_process_env
    from lrft.cli.bench import _free_port
    from lrft.eval import run_eval

    rank = os.environ.get("RANK", "0")
    try:
        settings, values = settings_from_args(argv)
        limit_library_bars(int(rank), requested=True)  # before any model is loaded
        if "RANK" not in os.environ:
            # One process: any free port for its 1-rank group, so two runs can go side by side.
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        _single_process_env()
        run_eval(settings, values)
    except ConfigError as error:
        print(redact(f"lrft eval: rank {rank}: configuration error: {error}"), file=sys.stderr)
        return 2
    except (LrftError, RuntimeError, OSError) as error:
        print(
            redact(f"lrft eval: rank {rank} failed: {type(error).__name__}: {error}"),
            file=sys.stderr,
        )
        raise
    return 0
