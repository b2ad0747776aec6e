"""The TRL side of the ragged benchmark (``scripts/trl_w2_ragged.py``) forces the lengths lrft
forces: its wrapper of ``generate`` on a tiny model, with transformers' own sampling loop (TRL
itself is not installed here; it calls the model's ``generate`` the same way)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from lrft.bench.ragged import forced_lengths
from lrft.bench.workloads import RaggedSpec
from lrft.testing.models import tiny_causal_lm

SCRIPT = Path(__file__).parents[2] / "scripts" / "trl_w2_ragged.py"


def test_the_trl_script_forces_the_same_lengths() -> None:
    spec_of_file = importlib.util.spec_from_file_location("trl_w2_ragged", SCRIPT)
    assert spec_of_file is not None
    assert spec_of_file.loader is not None
    script: Any = importlib.util.module_from_spec(spec_of_file)  # a script: no typed surface
    spec_of_file.loader.exec_module(script)
    assert (script.SPEC.min_tokens, script.SPEC.max_tokens) == (64, 1024)  # w2-ragged's
    script.SPEC = spec = RaggedSpec(min_tokens=2, max_tokens=12, seed=0)  # a tiny model's sizes
    model: Any = tiny_causal_lm(0)  # its generate is transformers' untyped one
    counts = script.force_lengths(model)
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7], [0, 9, 9, 9, 9]])  # left-padded
    # greedy: these prompts' greedy continuations hold no EOS of their own, so every row ends
    # exactly where it is forced to (the script counts what generate returned either way)
    config = GenerationConfig(  # type: ignore[no-untyped-call]  # unannotated in transformers
        max_new_tokens=12, do_sample=False, eos_token_id=1, pad_token_id=0
    )
    outputs = [
        model.generate(input_ids=ids, attention_mask=(ids != 0).long(), generation_config=config)
        for _ in range(3)
    ]
    for call, output in enumerate(outputs):
        lengths = [row.index(1) + 1 if 1 in row else len(row) for row in output[:, 5:].tolist()]
        assert lengths == forced_lengths(spec, call, 3)
        assert counts[call] == sum(lengths)
