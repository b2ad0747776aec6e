"""A short ``lrft train`` run in this process, recorded: what a flag's effect is measured by.

:func:`record_run` parses ``lrft train`` arguments, builds the trainer (world size 1, gloo) and
fits it, and returns what the run *did*: every engine call (prompt tokens, sampling parameters,
the tokens sampled), the metrics it logged (less timings and memory readings), the files it
wrote, the exported weights, what it printed, and what it built (the engine, train backend and
weight sync, the optimizer's hyperparameters, the trained module's attention kernel and frozen
parameters, the collective timeout its phase watch enforces). Two runs of the same arguments
give equal records; a flag that leaves the record unchanged does nothing a user could see.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

from lrft.api.types import GenerationRequest, GenerationResult, SamplingParams
from lrft.demos.task import AdditionTask
from lrft.rewards import RewardSample

Record = dict[str, Any]

_VOLATILE_METRICS = ("time/", "memory/")
"""Metric prefixes that measure the machine, not the run: left out of the record."""
_DURATION = re.compile(r"\b\d+(\.\d+)?(s|ms|m)\b")


def probe_reward(sample: RewardSample) -> float:
    """A reward that every input of a sample moves: the response's characters (so a random
    model's samples differ and their advantages are not zero), its label, reference and
    metadata columns. Importable as ``tests.unit.trainer.flag_probe:probe_reward``."""
    score = (sum(map(ord, sample.response)) % 10) / 10
    score += len(sample.label) / 10
    score += len(sample.reference or "") / 7
    score += len(sample.metadata) / 13
    return score


REWARD_FLAG = "--reward_fn=tests.unit.trainer.flag_probe:probe_reward"

ROLES_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
"""A chat template that renders every role (the demo tokenizer's knows only user messages):
the system prompt, tool turns and the template's own switch have something to change."""


def make_probe_model(directory: Path, seed: int = 0) -> Path:
    """The trainer tests' tiny model folder, its tokenizer rendering every chat role."""
    from transformers import AutoTokenizer

    from tests.trainer.fixtures import make_model_folder

    make_model_folder(directory, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = ROLES_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


@attrs.frozen(kw_only=True)
class ProbeInputs:
    """The files a probe run reads: a model folder and prompt files with extra columns."""

    model: Path
    train: Path
    other_train: Path
    held_out: Path
    splits: Path
    """A ``datasets`` folder with ``train``, ``other`` and ``test`` splits."""


def write_probe_data(directory: Path) -> tuple[Path, Path, Path, Path]:
    """Prompt rows with an ``input``, a ``question`` (another wording), an ``answer``, a
    ``label`` and a ``note`` column; a second training file and a ``datasets`` folder."""
    from datasets import Dataset, DatasetDict  # type: ignore[import-untyped]  # no type hints

    directory.mkdir(parents=True, exist_ok=True)
    task = AdditionTask(digits=2, num_train=24, num_eval=4)

    def rows(problems: Sequence[Any], offset: int) -> list[dict[str, str]]:
        return [
            {
                # every third prompt one token longer: --prompt_max_len has some to drop
                "input": problem.prompt if i % 3 else f"0{problem.prompt}",
                "question": f"{problem.prompt}?",
                "answer": problem.answer,
                "label": ("sum", "carry")[(i + offset) % 2],
                "note": str(i),
            }
            for i, problem in enumerate(problems)
        ]

    train_rows = rows(task.train_problems(), 0)
    paths = []
    for name, part in (
        ("train", train_rows[:12]),
        ("other", train_rows[12:]),
        ("eval", rows(task.eval_problems(), 1)),
    ):
        path = directory / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in part))
        paths.append(path)
    splits = directory / "splits"
    DatasetDict(
        {
            "train": Dataset.from_list(train_rows[:12]),
            "other": Dataset.from_list(train_rows[12:]),
            "test": Dataset.from_list(rows(task.eval_problems(), 1)),
        }
    ).save_to_disk(str(splits))
    return paths[0], paths[1], paths[2], splits


def base_argv(inputs: ProbeInputs, save: Path) -> list[str]:
    """One iteration of 2 prompts x 2 samples, 4 new tokens, two optimizer steps; a held-out
    evaluation at the start and the end."""
    return [
        "train",
        f"--pretrain={inputs.model}",
        f"--prompt_data={inputs.train}",
        f"--eval_dataset={inputs.held_out}",
        REWARD_FLAG,
        "--n_samples_per_prompt=2",
        "--rollout_batch_size=2",
        "--micro_rollout_batch_size=2",
        "--train_batch_size=2",
        "--micro_train_batch_size=1",
        "--generate_max_len=4",
        "--actor_learning_rate=1e-2",
        "--max_steps=1",
        "--eval_max_samples=2",
        "--no-progress_bar",
        f"--save_path={save}",
    ]


def _plain(value: Any) -> Any:
    if attrs.has(type(value)):
        return {k: _plain(v) for k, v in attrs.asdict(value, recurse=False).items()}
    if isinstance(value, torch.Tensor):
        return _digest([value])
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    return type(value).__name__


def _digest(tensors: Sequence[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for tensor in tensors:
        whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        h.update(whole.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class _EngineCalls:
    """Records each ``generate`` call of every hf engine while it is installed (the policy's
    and the judges'), each tagged with whether it was the policy's engine."""

    def __init__(self) -> None:
        self.calls: list[Record] = []
        self.policy: object | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        from lrft.backends.rollout.hf import HFRolloutEngine

        original = HFRolloutEngine.generate
        calls = self

        def generate(
            engine: HFRolloutEngine,
            requests: Sequence[GenerationRequest],
            params: SamplingParams,
        ) -> list[GenerationResult]:
            results = original(engine, requests, params)
            calls.calls.append(
                {
                    "engine": "policy" if engine is calls.policy else "other",
                    "prompts": [list(r.prompt_token_ids) for r in requests],
                    "caps": [r.max_new_tokens for r in requests],
                    "params": _plain(params),
                    "samples": [list(r.output_token_ids) for r in results],
                    "logprobs": [_plain(r.logprobs) for r in results],
                }
            )
            return results

        # recorded for the run: every engine instance's calls go through the class
        HFRolloutEngine.generate = generate  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            HFRolloutEngine.generate = original  # type: ignore[method-assign]


def _built(trainer: Any) -> Record:
    module = trainer.actor.module
    colocation = trainer.colocation
    optimizer = trainer.actor.optimizer
    groups = [
        {k: _plain(v) for k, v in group.items() if k != "params"}
        for group in optimizer.param_groups
    ]
    config = getattr(module, "config", None)
    frozen = sorted(n for n, p in module.named_parameters() if not p.requires_grad)
    return {
        "engine": type(trainer.engine).__name__,
        "engine_settings": _plain(getattr(trainer.engine, "config", None)),
        "backend": type(trainer.actor).__name__,
        "sync": type(colocation.weight_sync).__name__,
        "reference": type(colocation.reference).__name__,
        "critic": None if trainer.critic is None else type(trainer.critic).__name__,
        "offloads": [colocation.offload_reference, colocation.offload_optimizer],
        "optimizer": groups,
        "attention": getattr(config, "_attn_implementation", None),
        "checkpointing": bool(getattr(module, "is_activation_checkpointing", False)),
        "frozen": frozen,
        "parameters": sum(p.numel() for p in module.parameters()),
        "watch_timeout_s": _plain(trainer.watch.timeout_s),
        "sleeps": colocation.sleep_level,
    }


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def _metrics(save: Path) -> list[Record]:
    path = save / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows.append({k: _plain(v) for k, v in row.items() if not k.startswith(_VOLATILE_METRICS)})
    return rows


def _jsonl_texts(folder: Path) -> list[str]:
    return [p.read_text() for p in sorted(folder.glob("*.jsonl"))] if folder.is_dir() else []


@contextlib.contextmanager
def _rank_environment(port: int) -> Iterator[None]:
    names = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0"}
    names |= {"WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    before = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _own_process_group() -> Iterator[None]:
    if dist.is_initialized():
        raise RuntimeError("a probe run starts its own process group, but one is already up")
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record_run(argv: Sequence[str], root: Path) -> Record:
    """Run ``lrft train argv`` (its outputs under ``root``) in this process and record it. The
    run's process group (world size 1) is destroyed after it: the tests after it find none."""
    from lrft.cli import config_from_args
    from lrft.demos.apply import apply_demo_or_preset
    from lrft.trainer.build import build_trainer

    printed = io.StringIO()
    calls = _EngineCalls()
    with (
        _rank_environment(_free_port()),
        contextlib.redirect_stdout(printed),
        calls.installed(),
        _own_process_group(),
    ):
        config = apply_demo_or_preset(config_from_args(list(argv)), rank=0)
        trainer = build_trainer(config)
        calls.policy = trainer.engine
        built = _built(trainer)
        result = trainer.fit()
    save = Path(config.save_path)
    exported = save / "hf_model" / "model.safetensors"
    weights = (
        _digest(list(load_file(exported).values()))
        if exported.exists()
        else _digest([p.detach() for p in trainer.actor.module.parameters()])
    )
    lines = [_DURATION.sub("T", line) for line in printed.getvalue().splitlines()]
    return {
        "built": built,
        "calls": calls.calls,
        "metrics": _metrics(save),
        "steps": result.steps,
        "files": _files(root),
        "weights": weights,
        "trajectories": _jsonl_texts(save / "trajectories"),
        "printed": [line for line in lines if "written to" not in line],
    }


def differences(a: Record, b: Record) -> list[str]:
    """The record's parts that differ (for a failure message)."""
    return [key for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
