"""What holds a CUDA device's reserved memory: the allocator's segments by memory pool, with the
tensors still allocated in them and where each was allocated (from the allocator's history,
recorded between ``recording`` and the report)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

_MiB = 2**20


@contextmanager
def recording(device: torch.device) -> Iterator[None]:
    """Record the stack of every allocation on ``device`` made inside the block."""
    torch.cuda.memory._record_memory_history(max_entries=200_000, device=device)
    try:
        yield
    finally:
        torch.cuda.memory._record_memory_history(enabled=None, device=device)


def reserved_report(device: torch.device, *, blocks: int = 6, frames: int = 6) -> str:
    """The segments holding reserved memory, largest first, each with its pool, how much of it
    is allocated, and its largest allocated blocks with the innermost frames of lrft, tests or
    transformers code that allocated them."""
    snapshot: Any = torch.cuda.memory._snapshot(device)
    segments = sorted(snapshot["segments"], key=lambda s: s["total_size"], reverse=True)
    lines = [
        f"reserved {torch.cuda.memory_reserved(device) / _MiB:.1f} MiB, allocated "
        f"{torch.cuda.memory_allocated(device) / _MiB:.1f} MiB, in {len(segments)} segments"
    ]
    for segment in segments[:12]:
        lines.append(
            f"segment {segment['total_size'] / _MiB:.1f} MiB, pool {tuple(segment['segment_pool_id'])}, "
            f"allocated {segment['allocated_size'] / _MiB:.1f} MiB"
        )
        live = [b for b in segment["blocks"] if b["state"] != "inactive"]
        for block in sorted(live, key=lambda b: b["size"], reverse=True)[:blocks]:
            where = [
                f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}"
                for f in block.get("frames", [])
                if any(part in f["filename"] for part in ("lrft", "tests", "transformers"))
            ][:frames]
            lines.append(
                f"  {block['state']} {block['size'] / _MiB:.2f} MiB <- {' < '.join(where) or '?'}"
            )
    return "\n".join(lines)


def referrer_chains(target: object, *, depth: int = 5, width: int = 4) -> str:
    """What keeps ``target`` alive: the objects referring to it, and to those, ``depth`` deep
    (frames and this module's own containers left out)."""
    import gc
    import inspect

    lines: list[str] = []
    seen = {id(target)}

    def describe(obj: object) -> str:
        text = type(obj).__qualname__
        if isinstance(obj, dict):
            text += f" keys={list(obj)[:6]}"
        elif inspect.isfunction(obj) or inspect.ismethod(obj):
            text += f" {getattr(obj, '__qualname__', '')}"
        return text

    def walk(obj: object, level: int) -> None:
        if level >= depth:
            return
        referrers = [
            r
            for r in gc.get_referrers(obj)
            if not inspect.isframe(r) and id(r) not in seen and r is not lines and r is not seen
        ]
        for referrer in referrers[:width]:
            seen.add(id(referrer))
            lines.append("  " * level + describe(referrer))
            walk(referrer, level + 1)

    walk(target, 0)
    return "\n".join(lines) or "(no referrers)"
