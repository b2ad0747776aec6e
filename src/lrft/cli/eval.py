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
from lrft.backends import registry
from lrft.cli.flags import FLAGS, add_flag, shown_default, translate_names
from lrft.cli.launch import command_parser, single_process_env
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

EVAL_WORDING = {
    "max_samples": "Evaluate only the first N rows of --dataset.",
    "micro_rollout_batch_size": "Prompts per generate chunk, and sequences per reward-model "
    "forward (per rank).",
    "generate_max_len": "The most new tokens per response.",
    "temperature": "The sampling temperature (> 0) of the --n_samples responses per prompt (the "
    "greedy one ignores it).",
    "top_p": "The nucleus sampling threshold of the --n_samples responses per prompt.",
    "reward_pretrain": "Reward models: sequence-classification folders with one label, scoring "
    "prompt + response.",
    "attn_implementation": "The attention kernel of the models loaded beside the engine (a "
    "checkpoint's policy, the reward models): flash_attention_2 needs the flash-attn package and "
    "CUDA; the hf engine keeps its own kernel.",
    "seed": "The seed of the sampled responses.",
}
"""The help of the shared flags whose ``lrft train`` help speaks of training."""


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
        "checkpoints (its newest) [required]",
    )
    own.add_argument(
        "--dataset",
        required=True,
        help="prompts: .jsonl/.json/.parquet or datasets folder [required]",
    )
    own.add_argument("--split", default=None, help="a DatasetDict folder's split [default: train]")
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
    own.add_argument(
        "--output", default=None, help="write the JSON report here (rank 0) [default: unset]"
    )
    shared = parser.add_argument_group("shared with lrft train (same meaning)")
    by_name = {flag.name: flag for flag in FLAGS}
    for name in SHARED_FLAGS:
        text = EVAL_WORDING.get(name, by_name[name].help)
        add_flag(shared, by_name[name], f"{text} [{shown_default(by_name[name])}]")
    return parser


def settings_from_args(argv: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    """``lrft eval ...`` as :class:`~lrft.eval.EvalSettings` and the shared settings by name."""
    from lrft.eval import EvalSettings

    argv = list(argv)
    if argv[:1] == ["eval"]:
        # lrft train's guard: LightRFT's flags get their hints, and no value of a switch or of
        # an unknown flag is shown (it may be a secret)
        argv = ["eval", *translate(argv[1:], **_flag_names())]
    args = vars(command_parser(add_eval_parser).parse_args(argv))
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
    names = translate_names(
        (f for f in FLAGS if f.name in SHARED_FLAGS), registry.entries("rollout")
    )
    names["switches"].add("greedy")
    names["valued"].update(OWN_VALUED)
    return names


def eval_main(argv: Sequence[str]) -> int:
    """``lrft eval``; returns the exit code (2 for a configuration error)."""
    from lrft.eval import run_eval

    rank = os.environ.get("RANK", "0")
    try:
        settings, values = settings_from_args(argv)
        limit_library_bars(int(rank), requested=True)  # before any model is loaded
        single_process_env(any_port=True)
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
