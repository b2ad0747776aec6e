"""The distillation demo of docs/distillation.md: train the demo once with GRPO (the teacher),
then, from the demo's starting model, on-policy distillation from that teacher beside plain GRPO,
with held-out accuracy after every step; print the steps each run takes to come within 0.05 of
the teacher's accuracy, and the accuracies step by step. Run from the repository root (two CPU
cores: 20 to 40 s a run, the teacher's included; about 6 min for the three seeds)::

    python scripts/distill_demo.py --out /tmp/distill-demo
    python scripts/distill_demo.py --out /tmp/distill-demo --seeds 42 1 2

Each run is the ``torchrun --nproc_per_node 2 -m lrft train ...`` command it prints; a run whose
folder already holds its metrics is read, not repeated.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

RUNS: dict[str, list[str]] = {
    "distill, lr 1e-3": [
        "--advantage_estimator",
        "on_policy_distillation",
        "--actor_learning_rate",
        "1e-3",
    ],
    "GRPO, lr 3e-4 (the demo's)": [],
    "GRPO, lr 1e-3": ["--actor_learning_rate", "1e-3"],
    "distill, lr 3e-4": ["--advantage_estimator", "on_policy_distillation"],
}
"""The compared runs: their flags beside the demo's own (a distillation run adds its teacher)."""
MARGIN = 0.05


def lrft_train(args: list[str], save: Path) -> list[str]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    return [*torchrun, "-m", "lrft", "train", "--save_path", str(save), "--no-progress_bar", *args]


def run(command: list[str], save: Path) -> None:
    if (save / "metrics.jsonl").is_file() and (save / "run.json").is_file():
        return
    print("$ torchrun", " ".join(command[3:]), flush=True)  # what follows torch.distributed.run
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)


def accuracies(save: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval/accuracy"] for r in rows if r.get("kind") == "eval"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    teacher = args.out / "teacher"
    run(lrft_train([], teacher), teacher)
    target = accuracies(teacher)[max(accuracies(teacher))]
    threshold = round(target - MARGIN, 6)
    print(f"teacher: held-out accuracy {target:.3f}; threshold {threshold:.3f}")
    table: dict[str, dict[int, float]] = {}
    for seed in args.seeds:
        for index, (name, flags) in enumerate(RUNS.items()):
            save = args.out / f"run{index}_seed{seed}"
            extra = ["--teacher_pretrain", str(teacher / "hf_model")] if "distill" in name else []
            common = ["--seed", str(seed), "--eval_steps", "1", "--max_steps", str(args.steps)]
            run(lrft_train([*flags, *extra, *common, "--no-save_hf_model"], save), save)
            table[f"{name}, seed {seed}"] = accuracies(save)
    for name, curve in table.items():
        reached = next((step for step in sorted(curve) if curve[step] >= threshold), None)
        after = [curve[s] for s in sorted(curve) if reached is not None and s >= reached]
        low = f", lowest after {min(after):.3f}" if after else ""
        print(f"{name}: within {MARGIN} at step {reached}{low}, last {curve[max(curve)]:.3f}")
    names = list(table)
    print("step | " + " | ".join(names))
    for step in sorted(table[names[0]]):
        print(f"{step} | " + " | ".join(f"{table[n].get(step, float('nan')):.3f}" for n in names))


if __name__ == "__main__":
    main()
