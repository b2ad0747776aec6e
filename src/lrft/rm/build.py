"""Build a ready :class:`RMTrainer` from an :class:`RMTrainConfig`: data, model, backend, export.

Everything that can be checked without a process group is checked first, on every rank: the
run's folders (:func:`lrft.run.outputs.claim_outputs`), a resume's settings against its
checkpoint, the model folder, and every row of the data (read and tokenised here, before the
process group starts), so bad input fails before anything is wrapped or trained.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from lrft.api.errors import ConfigError
from lrft.api.optim import OptimizerConfig, ScheduleKind, SchedulerConfig
from lrft.api.protocols import TrainBackend
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.config.inputs import check_model_folder as check_folder
from lrft.data import PromptFormat
from lrft.dist import RankInfo, init_distributed
from lrft.rm.config import RMTrainConfig
from lrft.rm.data import (
    Columns,
    ExampleSet,
    JudgeExample,
    PreferencePair,
    StepExample,
    load_judge_examples,
    load_preference_pairs,
)
from lrft.rm.demo import demo_rm_config
from lrft.rm.model import (
    load_judge,
    load_process_rm,
    load_scalar_rm,
    sequence_classifier_from_config,
    token_classifier_from_config,
)
from lrft.rm.objectives import Objective, PairObjective, StepObjective, VerdictObjective
from lrft.rm.steps import StepColumns, load_step_examples
from lrft.rm.trainer import RMTrainer, check_resumable, planned_steps
from lrft.run import checkpoint as ckpt
from lrft.run.export import export_hf
from lrft.run.outputs import claim_outputs

if TYPE_CHECKING:
    from lrft.backends.train.deepspeed import ZeroStage

E = TypeVar("E", PreferencePair, JudgeExample, StepExample)


def rm_backend(config: RMTrainConfig) -> TrainBackend:
    """FSDP2 by default; DeepSpeed ZeRO at ``config.zero_stage`` when it is set."""
    if config.zero_stage is None:
        return FSDP2Backend(FSDP2Config())
    # imported here: deepspeed is an optional dependency and lrft never imports it unasked
    from lrft.backends.train.deepspeed import DeepSpeedBackend, DeepSpeedConfig, read_override

    override = (
        {} if config.deepspeed_config is None else read_override(Path(config.deepspeed_config))
    )
    return DeepSpeedBackend(
        DeepSpeedConfig(zero_stage=cast("ZeroStage", config.zero_stage), override=override)
    )


def check_model_folder(config: RMTrainConfig) -> None:
    """``pretrain`` is a model folder (config, weights, tokenizer: as ``lrft train`` checks its
    own) of the kind the mode trains from: any transformers model for a scalar RM, and not a
    classifier for a judge (a judge generates)."""
    assert config.pretrain is not None
    check_folder("pretrain", config.pretrain, tokenizer=True)
    config_file = Path(config.pretrain) / "config.json"
    architectures = json.loads(config_file.read_text(encoding="utf-8")).get("architectures") or []
    if config.generative and any(
        str(a).endswith("ForSequenceClassification") for a in architectures
    ):
        raise ConfigError(
            f"pretrain {config.pretrain!r} is a {architectures[0]} (a scalar head); a judge is a "
            "causal LM that writes its verdict"
        )
    for flag, path in (("dataset", config.dataset), ("eval_dataset", config.eval_dataset)):
        if path is not None and not Path(path).exists():
            raise ConfigError(
                f"--{flag} {path!r}: no such file or folder (reward-model data is read from "
                "local JSONL, JSON or Parquet files or a datasets folder)"
            )


def _columns(config: RMTrainConfig) -> Columns:
    return Columns(
        prompt=config.prompt_key,
        chosen=config.chosen_key,
        rejected=config.rejected_key,
        margin=config.margin_key,
        response=config.response_key,
        verdict=config.verdict_key,
        reference=config.reference_key,
    )


def load_pairs(
    config: RMTrainConfig, path: str, tokenizer: PreTrainedTokenizerBase, limit: int | None
) -> ExampleSet[PreferencePair]:
    return load_preference_pairs(
        path,
        columns=_columns(config),
        prompt_format=PromptFormat(
            apply_chat_template=config.apply_chat_template, input_template=config.input_template
        ),
        tokenizer=tokenizer,
        max_len=config.max_len,
        max_samples=limit,
    )


def load_judging(
    config: RMTrainConfig, path: str, tokenizer: PreTrainedTokenizerBase, limit: int | None
) -> ExampleSet[JudgeExample]:
    return load_judge_examples(
        path,
        columns=_columns(config),
        template=config.judge_template,
        prompt_format=PromptFormat(input_template=config.input_template),
        chat=config.apply_chat_template,
        tokenizer=tokenizer,
        max_len=config.max_len,
        max_samples=limit,
    )


def load_steps(
    config: RMTrainConfig, path: str, tokenizer: PreTrainedTokenizerBase, limit: int | None
) -> ExampleSet[StepExample]:
    assert config.step_separator is not None
    return load_step_examples(
        path,
        separator=config.step_separator,
        columns=StepColumns(
            prompt=config.prompt_key, steps=config.steps_key, labels=config.step_labels_key
        ),
        prompt_format=PromptFormat(
            apply_chat_template=config.apply_chat_template, input_template=config.input_template
        ),
        tokenizer=tokenizer,
        max_len=config.max_len,
        max_samples=limit,
    )


def schedule(config: RMTrainConfig, steps: int) -> SchedulerConfig:
    try:
        return SchedulerConfig(
            kind=cast("ScheduleKind", config.lr_scheduler),
            warmup_steps=config.lr_warmup_steps,
            total_steps=steps,
        )
    except ValueError as error:
        raise ConfigError(
            f"lr_scheduler {config.lr_scheduler!r} with lr_warmup_steps "
            f"{config.lr_warmup_steps} over this run's {steps} steps: {error}"
        ) from error


def _resume_check(config: RMTrainConfig, fingerprint: str, steps: int) -> None:
    latest = ckpt.latest_checkpoint(Path(config.checkpoint_dir))
    if config.load_checkpoint and latest is not None:
        check_resumable(ckpt.read_manifest(latest), config, latest, fingerprint, steps)


def _prepared(config: RMTrainConfig, info: RankInfo) -> RMTrainConfig:
    """The checks that read files only, and the demo's model and data filled in."""
    config.validate_world(info.world_size)
    removed = claim_outputs(config, rank=info.rank)
    if removed is not None and info.rank == 0:
        print(removed, flush=True)
    if config.pretrain is None:
        config = demo_rm_config(config, info.rank)
    check_model_folder(config)
    return config


Load = Callable[[RMTrainConfig, str, PreTrainedTokenizerBase, "int | None"], ExampleSet[E]]


def _data(
    config: RMTrainConfig, tokenizer: PreTrainedTokenizerBase, load: Load[E], rank: int
) -> tuple[ExampleSet[E], ExampleSet[E] | None]:
    assert config.dataset is not None
    train = load(config, config.dataset, tokenizer, config.max_samples)
    held_out = (
        None
        if config.eval_dataset is None
        else load(config, config.eval_dataset, tokenizer, config.eval_max_samples)
    )
    if len(train) < config.train_batch_size:
        raise ConfigError(
            f"dataset {config.dataset!r} has {len(train)} usable examples, fewer than one "
            f"train_batch_size ({config.train_batch_size})"
        )
    if rank == 0:
        for data in (train, held_out):
            if data is not None:
                print(data.summary(), flush=True)
    return train, held_out


BackendFactory = Callable[[RMTrainConfig], TrainBackend]


def build_rm_trainer(
    config: RMTrainConfig,
    rank_info: RankInfo | None = None,
    *,
    backend: BackendFactory = rm_backend,
) -> RMTrainer[PreferencePair] | RMTrainer[JudgeExample] | RMTrainer[StepExample]:
    """Check the run's folders, settings, model and data, then start the process group and
    build the trainer (see the module docstring) on the train backend ``backend`` makes once the
    process group is up (the one ``zero_stage`` names, unless told)."""
    info = rank_info if rank_info is not None else RankInfo.from_env()
    config = _prepared(config, info)
    assert config.pretrain is not None
    tokenizer = AutoTokenizer.from_pretrained(config.pretrain)
    if config.generative:
        judging = _data(config, tokenizer, load_judging, info.rank)
        return _assemble(
            config, info, tokenizer, judging, lambda pad: VerdictObjective(pad_id=pad), backend
        )
    if config.step_separator is not None:
        steps = _data(config, tokenizer, load_steps, info.rank)
        return _assemble(
            config, info, tokenizer, steps, lambda pad: StepObjective(pad_id=pad), backend
        )
    pairs = _data(config, tokenizer, load_pairs, info.rank)
    return _assemble(config, info, tokenizer, pairs, lambda pad: PairObjective(pad_id=pad), backend)


def _rank_zero_print(line: str) -> None:
    print(line, flush=True)


def _assemble(
    config: RMTrainConfig,
    info: RankInfo,
    tokenizer: PreTrainedTokenizerBase,
    data: tuple[ExampleSet[E], ExampleSet[E] | None],
    objective: Callable[[int], Objective[E]],
    make_backend: BackendFactory,
) -> RMTrainer[E]:
    """Start the process group, wrap the model and make the trainer. Collective."""
    assert config.pretrain is not None
    train, held_out = data
    steps = planned_steps(config, len(train) // config.train_batch_size)
    lr_schedule = schedule(config, steps)
    _resume_check(config, train.fingerprint, steps)
    init_distributed(info, timeout=timedelta(seconds=config.collective_timeout_s))
    torch.manual_seed(config.seed)
    backend = make_backend(config)
    announce = _rank_zero_print if info.rank == 0 else None
    if config.generative:
        model, model_config = load_judge(config.pretrain)
    elif config.step_separator is not None:
        model, model_config = load_process_rm(
            config.pretrain, tokenizer, seed=config.seed, announce=announce
        )
    else:
        model, model_config = load_scalar_rm(
            config.pretrain, tokenizer, seed=config.seed, announce=announce
        )
    pad = (
        model_config.pad_token_id
        if model_config.pad_token_id is not None
        else tokenizer.pad_token_id
    )
    trainable = backend.prepare_trainable(
        model,
        optimizer=OptimizerConfig(
            lr=config.learning_rate, weight_decay=config.l2, max_grad_norm=config.max_norm
        ),
        scheduler=lr_schedule,
    )
    pretrain = config.pretrain
    generative = config.generative
    from_config = (
        sequence_classifier_from_config
        if config.step_separator is None
        else token_classifier_from_config
    )

    def export(directory: Path) -> None:
        if generative:
            export_hf(trainable, pretrained=pretrain, tokenizer=tokenizer, directory=directory)
            return
        export_hf(
            trainable,
            pretrained=pretrain,
            tokenizer=tokenizer,
            directory=directory,
            model_config=model_config,
            from_config=from_config,
        )

    return RMTrainer(
        config=config,
        model=trainable,
        objective=objective(int(pad or 0)),
        train=train,
        held_out=held_out,
        device=backend.device,
        schedule_steps=steps,
        export=export,
    )
