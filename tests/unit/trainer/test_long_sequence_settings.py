"""The settings of packing and sequence parallelism are refused, with the value and the rule,
before any process group starts: sequence parallelism without packing, groups that do not fill
the world or split its batch, heads that do not divide (the actor's, a distillation
teacher's), model families lrft does not pack (a process reward model's too), and a train
backend that does not declare what they need."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from transformers import GPT2Config, Qwen2Config

from lrft.api.capabilities import TrainCapabilities
from lrft.api.errors import CapabilityNotSupported, ConfigError
from lrft.cli import config_from_args
from lrft.config import TrainConfig
from lrft.dist import RankInfo
from lrft.dist.sequence_parallel import SequenceParallelLayout
from lrft.models.packed_attention import check_packing_support
from lrft.testing.models import tiny_qwen2_config
from lrft.trainer.packing import token_layout
from lrft.trainer.preflight import check_before_start
from tests.trainer.fixtures import base_args, make_model_folder, make_prompt_files


def test_sequence_parallelism_needs_packing_and_groups_that_fill_the_world() -> None:
    with pytest.raises(ConfigError, match=r"sequence_parallel_size 2 splits packed rows: it needs"):
        TrainConfig(sequence_parallel_size=2)
    config = TrainConfig(
        packing_samples=True,
        sequence_parallel_size=2,
        rollout_batch_size=12,
        train_batch_size=12,
        micro_train_batch_size=2,
    )
    with pytest.raises(ConfigError, match=r"world size 3 is not divisible by sequence_parallel_"):
        config.validate_world(3)
    config.validate_world(4)  # two groups, each trains 6 samples a step in 3 micro-batches
    with pytest.raises(
        ConfigError,
        match=r"train_batch_size 12 must equal sequence-parallel groups 2 x "
        r"micro_train_batch_size 4",
    ):
        TrainConfig(
            packing_samples=True,
            sequence_parallel_size=2,
            rollout_batch_size=4,
            train_batch_size=12,
            micro_train_batch_size=4,
            n_samples_per_prompt=3,
        ).validate_world(4)
    with pytest.raises(ConfigError, match=r"sp_size must be >= 1, got 0"):
        SequenceParallelLayout(world_size=2, sp_size=0)
    assert SequenceParallelLayout(world_size=4, sp_size=2).groups == ((0, 1), (2, 3))


def test_packing_refuses_audio() -> None:
    with pytest.raises(ConfigError, match=r"packing_samples does not pack audio"):
        TrainConfig(packing_samples=True, audios_key="audio", apply_chat_template=True)


def test_packing_support_names_the_family_the_window_and_the_heads() -> None:
    check_packing_support(tiny_qwen2_config(), 2)
    with pytest.raises(ConfigError, match=r"model_type 'gpt2' is not among the families"):
        check_packing_support(GPT2Config())
    sliding = Qwen2Config(use_sliding_window=True, sliding_window=16, max_window_layers=0)
    with pytest.raises(ConfigError, match=r"sliding-window attention"):
        check_packing_support(sliding)
    with pytest.raises(
        ConfigError,
        match=r"sequence_parallel_size 3 must divide the model's 4 attention heads .* 4 % 3 = 1",
    ):
        check_packing_support(tiny_qwen2_config(), 3)


def test_heads_that_do_not_divide_are_refused_before_the_process_group(tmp_path: Path) -> None:
    model = make_model_folder(tmp_path / "model")
    train, held_out = make_prompt_files(tmp_path / "data")
    args = base_args(model, train, held_out, tmp_path / "out")
    config = config_from_args([*args, "--packing_samples", "--sequence_parallel_size=3"])
    with pytest.raises(
        ConfigError, match=r"pretrain '.*model': sequence_parallel_size 3 must divide the model's 4"
    ):
        check_before_start(config)
    assert not dist.is_initialized()
    check_before_start(config_from_args([*args, "--packing_samples"]))


class _Backend:
    name = "plain"
    device = torch.device("cpu")

    def __init__(self, capabilities: TrainCapabilities) -> None:
        self.capabilities = capabilities


def test_a_backend_that_does_not_declare_packing_is_refused() -> None:
    info = RankInfo(
        rank=0, local_rank=0, world_size=2, local_world_size=2, device=torch.device("cpu")
    )
    packing = TrainConfig(packing_samples=True)
    with pytest.raises(CapabilityNotSupported, match=r"plain does not support packed_sequences"):
        token_layout(packing, info, _Backend(TrainCapabilities()))  # type: ignore[arg-type]  # a stand-in backend with only its capabilities
    split = TrainConfig(packing_samples=True, sequence_parallel_size=2)
    with pytest.raises(
        CapabilityNotSupported,
        match=r"plain does not support sequence_parallel: --packing_samples "
        r"--sequence_parallel_size 2 needs",
    ):
        token_layout(split, info, _Backend(TrainCapabilities(packed_sequences=True)))  # type: ignore[arg-type]  # a stand-in backend with only its capabilities
    assert not token_layout(TrainConfig(), info, _Backend(TrainCapabilities())).packed  # type: ignore[arg-type]  # a stand-in backend with only its capabilities


def test_a_teacher_and_a_process_reward_model_are_checked_as_packed_models(
    tmp_path: Path,
) -> None:
    """The teacher runs the reference's packed, split forward (its heads must divide); the
    process reward model packs each rank's rows unsplit (its family alone is checked)."""
    from transformers import GPT2ForTokenClassification, Qwen2ForCausalLM

    from lrft.demos.tokenizer import PAD_ID, VOCAB_SIZE, build_tokenizer

    model = make_model_folder(tmp_path / "model")
    train, held_out = make_prompt_files(tmp_path / "data")
    two_heads = tmp_path / "teacher"
    Qwen2ForCausalLM(
        tiny_qwen2_config(num_attention_heads=2, num_key_value_heads=2)
    ).save_pretrained(two_heads)
    build_tokenizer().save_pretrained(two_heads)
    gpt2 = tmp_path / "prm"
    gpt2_config = GPT2Config(vocab_size=VOCAB_SIZE, n_embd=32, n_layer=1, n_head=2)
    gpt2_config.num_labels, gpt2_config.pad_token_id = 1, PAD_ID
    GPT2ForTokenClassification(gpt2_config).save_pretrained(gpt2)
    build_tokenizer().save_pretrained(gpt2)
    args = base_args(model, train, held_out, tmp_path / "out")
    teacher = ["--advantage_estimator=on_policy_distillation", f"--teacher_pretrain={two_heads}"]
    check_before_start(config_from_args([*args, *teacher, "--packing_samples"]))
    split = ["--packing_samples", "--sequence_parallel_size=4"]
    with pytest.raises(
        ConfigError,
        match=r"teacher_pretrain '.*teacher': sequence_parallel_size 4 must divide the model's 2",
    ):
        check_before_start(config_from_args([*args, *teacher, *split]))
    process = [f"--prm_pretrain={gpt2}", "--prm_step_separator=;"]
    check_before_start(config_from_args([*args, *process]))  # padded rows: any family
    with pytest.raises(ConfigError, match=r"prm_pretrain '.*prm': .* model_type 'gpt2'"):
        check_before_start(config_from_args([*args, *process, "--packing_samples"]))
