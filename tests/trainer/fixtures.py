"""A tiny model folder (demo tokenizer, random Qwen2) and addition prompt files for trainer tests."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2ForCausalLM, Qwen2ForSequenceClassification

from lrft.demos.task import AdditionTask, write_jsonl
from lrft.demos.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE, build_tokenizer
from lrft.dist import RankInfo
from lrft.testing.models import INITIALIZER_RANGE, tiny_qwen2_config


def make_model_folder(directory: Path, seed: int = 0) -> Path:
    """A random tiny Qwen2 over the demo tokenizer, saved with it (safetensors)."""
    config = tiny_qwen2_config(vocab_size=VOCAB_SIZE)
    config.eos_token_id = EOS_ID
    config.pad_token_id = PAD_ID
    config.bos_token_id = None
    config.initializer_range = INITIALIZER_RANGE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    return directory


def make_reward_model(directory: Path) -> Path:
    """A random one-label Qwen2 classifier over the demo tokenizer, saved with it."""
    config = tiny_qwen2_config(vocab_size=VOCAB_SIZE)
    config.num_labels = 1
    config.pad_token_id = PAD_ID
    config.initializer_range = INITIALIZER_RANGE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = Qwen2ForSequenceClassification(config)  # type: ignore[no-untyped-call]  # unannotated in transformers
    model.save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    return directory


def make_prompt_files(directory: Path) -> tuple[Path, Path]:
    task = AdditionTask(digits=2, num_train=64, num_eval=8)
    train = write_jsonl(directory / "train.jsonl", task.train_problems())
    held_out = write_jsonl(directory / "eval.jsonl", task.eval_problems())
    return train, held_out


def exact(sample: object) -> float:
    """The demo reward, importable as ``tests.trainer.fixtures:exact``."""
    from lrft.demos import exact_answer
    from lrft.rewards import RewardSample

    assert isinstance(sample, RewardSample)
    return exact_answer(sample)


def digit_fraction(sample: object) -> float:
    """The share of the response's characters that are digits: varied even for a random model,
    so advantages are non-zero and training moves the weights."""
    from lrft.rewards import RewardSample

    assert isinstance(sample, RewardSample)
    text = sample.response
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


REWARD_FLAG = "--reward_fn=tests.trainer.fixtures:digit_fraction"


def base_args(model: Path, train: Path, held_out: Path, save: Path) -> list[str]:
    """Flags of a small, fast run (2 ranks): 4 prompts x 4 samples per iteration."""
    return [
        "train",
        f"--pretrain={model}",
        f"--prompt_data={train}",
        f"--eval_dataset={held_out}",
        "--reference_key=answer",
        REWARD_FLAG,
        "--n_samples_per_prompt=4",
        "--rollout_batch_size=4",
        "--micro_rollout_batch_size=2",
        "--train_batch_size=8",
        "--micro_train_batch_size=2",
        "--generate_max_len=4",
        "--actor_learning_rate=1e-3",
        f"--save_path={save}",
    ]


def exact_then_hang(sample: object) -> float:
    """``exact``, but blocks forever once the file named by ``LRFT_TEST_HANG_WHEN`` exists: a
    run can be stopped deterministically after a given checkpoint was written."""
    import os
    import time

    flag = os.environ.get("LRFT_TEST_HANG_WHEN")
    if flag is not None and Path(flag).exists():
        time.sleep(3600)
    return digit_fraction(sample)


def exact_but_rank1_raises(sample: object) -> float:
    """``exact`` on rank 0; raises on rank 1 (a reward that fails on one rank mid-phase)."""
    import os

    if os.environ.get("RANK") == "1":
        raise ValueError("deliberate failure on rank 1")
    return digit_fraction(sample)


_scored = 0


def digit_fraction_but_rank1_stops(sample: object) -> float:
    """``digit_fraction``; rank 1 (or ``LRFT_TEST_STOP_RANK``) stops itself (SIGSTOP, as ``kill
    -STOP`` would) on its ``LRFT_TEST_STOP_AT``-th sample: with ``base_args`` and no held-out
    data a rank scores 8 samples per step, so 9 stops it in step 2's rewards phase."""
    import os
    import signal

    global _scored
    _scored += 1
    stops = os.environ.get("RANK") == os.environ.get("LRFT_TEST_STOP_RANK", "1")
    if stops and _scored == int(os.environ["LRFT_TEST_STOP_AT"]):
        os.kill(os.getpid(), signal.SIGSTOP)
    return digit_fraction(sample)


def rank_info() -> RankInfo:
    """This harness rank's place, as torchrun's environment would give it (one host)."""
    from lrft.testing.distributed import current_rank_context

    context = current_rank_context()
    return RankInfo(
        rank=context.rank,
        local_rank=context.rank,
        world_size=context.world_size,
        local_world_size=context.world_size,
        device=context.device,
    )
