"""Step-labelled rows for the process-reward example of docs/distillation.md: sums of three
numbers worked in two steps (``12+35=47;47+8=55``), written as the JSONL ``lrft train-rm
--step_separator ';'`` reads. A third of the first steps are off by one (an arithmetic slip), a
third of the second steps start from a miscopied number (a copying slip); each is labelled 0::

    python scripts/make_step_rows.py --out /tmp/prm-data    # train.jsonl, eval.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def rows(count: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    for _ in range(count):
        a, b, c = rng.randrange(10, 90), rng.randrange(10, 90), rng.randrange(1, 10)
        first = a + b + (rng.random() < 1 / 3)
        copied = first + (rng.randrange(1, 10) if rng.random() < 1 / 3 else 0)
        out.append(
            {
                "prompt": f"{a}+{b}+{c}=",
                "steps": [f"{a}+{b}={first}", f"{copied}+{c}={copied + c}"],
                "labels": [int(first == a + b), int(copied == first)],
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, count, seed in (("train", 2048, 0), ("eval", 256, 1)):
        lines = "".join(json.dumps(row) + "\n" for row in rows(count, seed))
        (args.out / f"{name}.jsonl").write_text(lines)
    print(f"wrote {args.out}/train.jsonl (2048 rows) and eval.jsonl (256 rows)")


if __name__ == "__main__":
    main()
