"""The ratio of a side-by-side benchmark, labelled, or a refusal to give one.

``python -m lrft.bench.pair --lrft lrft_w2.json --trl trl_w2_cb.json`` reads ``lrft bench``'s
document and a TRL script's (``scripts/trl_grpo.py``, ``scripts/trl_vl1.py``) and prints one
line: both sides' seconds per step and samples per second (medians of the same steady steps,
each side's whole loop), each side's configuration in words, whether both were measured in the
same call (``LRFT_BENCH_CALL``), and lrft's samples/s over TRL's. It refuses, with a message and
exit status 1, when either document is missing, empty, unreadable or incomplete (a stage that
ran out of time), or when the two are of different workloads or step windows: no ratio is
printed from half a pair. ``--output`` also writes the line's figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lrft.bench.report import write_json


class Refusal(Exception):
    """Why no ratio is given."""


def _read(path: Path, side: str) -> dict[str, Any]:
    if not path.is_file() or path.stat().st_size == 0:
        raise Refusal(f"the {side} side's document {path} is missing or empty")
    try:
        document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise Refusal(f"the {side} side's document {path} is unreadable: {error}") from error
    return document


def lrft_side(document: dict[str, Any], path: Path) -> dict[str, Any]:
    """lrft's GRPO figures and configuration, or a refusal."""
    if document.get("parts_pending"):
        raise Refusal(f"{path} is incomplete: parts {document['parts_pending']} never finished")
    grpo = document.get("grpo")
    if grpo is None:
        raise Refusal(f"{path} holds no grpo part")
    config = grpo["train_config"]
    env = document["environment"]
    backend = f"DeepSpeed ZeRO-{config['zero_stage']}" if config.get("zero_stage") else "FSDP2"
    if backend == "FSDP2":
        keeps = not config.get("fsdp_reshard_after_forward", True)
        backend += " keeping gathered weights" if keeps else " re-gathering after forward"
    numerics = (
        "fp32 master weights, bf16 compute"
        if env["device_type"] == "cuda"
        else "fp32 (a CPU dry run)"
    )
    engine = grpo.get("engine", {})
    label = (
        f"lrft {env['lrft']} GRPO, {engine.get('name', config.get('engine_type'))} engine "
        f"({engine.get('decode_path')}), {backend}, {numerics}"
    )
    return {
        "workload": document["workload"]["name"],
        "label": label,
        "call": env.get("call"),
        "steady_steps": grpo["steady_steps"],
        "step_seconds_median": grpo["step_seconds_median"],
        "samples_per_s": grpo["samples_per_s"],
        "generate_seconds_median": grpo["phases_seconds_median"].get("generate"),
        "peak_memory_mib": grpo.get("peak_memory_mib"),
        "phases_peak_memory_mib": grpo.get("phases_peak_memory_mib", {}),
    }


def trl_side(document: dict[str, Any], path: Path) -> dict[str, Any]:
    """TRL's figures and configuration, or a refusal."""
    if not document.get("complete"):
        raise Refusal(f"{path} is incomplete: {document.get('steps', 0)} steps were written")
    return {
        "workload": document["workload"],
        "label": f"{document['configuration']['label']} (TRL {document['trl']})",
        "call": document.get("call"),
        "steady_steps": document["steady_steps"],
        "step_seconds_median": document["step_seconds_median"],
        "samples_per_s": document["samples_per_s"],
        "callback_step_seconds_median": document["callback_step_seconds_median"],
        "generate_seconds_median": document["phases_seconds_median"]["generate"],
        "peak_memory_mib": document.get("peak_memory_mib"),
        "phases_peak_memory_mib": document.get("phases_peak_memory_mib", {}),
    }


def pair(lrft_path: Path, trl_path: Path) -> dict[str, Any]:
    """Both sides and the ratio, or a :class:`Refusal`."""
    lrft = lrft_side(_read(lrft_path, "lrft"), lrft_path)
    trl = trl_side(_read(trl_path, "TRL"), trl_path)
    if lrft["workload"] != trl["workload"]:
        raise Refusal(f"workloads differ: lrft ran {lrft['workload']!r}, TRL {trl['workload']!r}")
    if lrft["steady_steps"] != trl["steady_steps"]:
        raise Refusal(
            f"step windows differ: lrft's steady steps {lrft['steady_steps']}, TRL's "
            f"{trl['steady_steps']}"
        )
    if not (lrft["samples_per_s"] > 0 and trl["samples_per_s"] > 0):
        raise Refusal("a side reports no samples per second")
    same_call = lrft["call"] is not None and lrft["call"] == trl["call"]
    return {
        "workload": lrft["workload"],
        "same_call": same_call,
        "call": lrft["call"] if same_call else [lrft["call"], trl["call"]],
        "lrft": lrft,
        "trl": trl,
        "ratio_samples_per_s": lrft["samples_per_s"] / trl["samples_per_s"],
        "ratio_against_trl_callback_window": (
            trl["callback_step_seconds_median"] / lrft["step_seconds_median"]
        ),
    }


def describe(result: dict[str, Any]) -> str:
    lrft, trl = result["lrft"], result["trl"]
    steps = lrft["steady_steps"]
    where = (
        f"same call {result['call']}"
        if result["same_call"]
        else f"NOT the same call ({result['call'][0]} / {result['call'][1]}): indicative only"
    )
    return (
        f"{result['workload']}, medians of steps {steps[0]}-{steps[-1]}, {where}: "
        f"lrft {lrft['step_seconds_median']:.3f} s/step, {lrft['samples_per_s']:.2f} samples/s "
        f"[{lrft['label']}] vs TRL {trl['step_seconds_median']:.3f} s/step whole loop "
        f"({trl['callback_step_seconds_median']:.3f} s in its callback window), "
        f"{trl['samples_per_s']:.2f} samples/s [{trl['label']}]: "
        f"{result['ratio_samples_per_s']:.2f}x "
        f"({result['ratio_against_trl_callback_window']:.2f}x against the callback window)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lrft.bench.pair", description=__doc__)
    parser.add_argument("--lrft", required=True, type=Path, help="lrft bench's JSON document")
    parser.add_argument("--trl", required=True, type=Path, help="the TRL script's JSON document")
    parser.add_argument("--output", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    try:
        result = pair(args.lrft, args.trl)
    except Refusal as refusal:
        print(f"no ratio: {refusal}", file=sys.stderr, flush=True)
        return 1
    print(describe(result), flush=True)
    if args.output is not None:
        write_json(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
