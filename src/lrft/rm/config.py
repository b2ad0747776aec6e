"""The settings of ``lrft train-rm``: one frozen record, validated whole before any process group
starts. Field names follow ``lrft train``'s where the meaning is the same (``pretrain``,
``train_batch_size``, ``zero_stage``, ``save_path``, ``load_checkpoint``...), so that the output
folders, checkpoints and resumes work, and read, alike. Errors name the value and the rule.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from lrft.api import validators as v
from lrft.api.errors import ConfigError
from lrft.config import validators as f
from lrft.config.flag_spec import flag, optional_int
from lrft.config.problems import reporting
from lrft.extras import tensorboard_available
from lrft.rewards.judge_template import JUDGE_TEMPLATES, JudgeTemplate, load_judge_template

LR_SCHEDULES = ("constant", "linear", "cosine")
SCALAR_ONLY = ("chosen_key", "rejected_key", "margin_key")
"""Settings of Bradley-Terry training from pairs, refused with ``generative``."""
GENERATIVE_ONLY = ("response_key", "verdict_key", "reference_key", "grm_template")
"""Settings of judge training, which need ``generative``."""
PROCESS_ONLY = ("steps_key", "step_labels_key")
"""Settings of process reward model training, which need ``step_separator``."""


def _schedule(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in LR_SCHEDULES:
        raise ConfigError(f"{attribute.name} {value!r} is unknown; choose one of {LR_SCHEDULES}")


class RMFlagGroup(enum.Enum):
    """The sections of ``lrft train-rm --help``, in the order shown; the value is the title."""

    MODEL_AND_DATA = "model and data"
    JUDGE = "judge training (--generative)"
    PROCESS = "process reward model training (--step_separator)"
    TRAINING = "training"
    BACKEND = "train backend (FSDP2, DeepSpeed) and collectives"
    OUTPUT = "outputs, checkpoints and evaluation"


MODEL_AND_DATA = flag(RMFlagGroup.MODEL_AND_DATA)
JUDGE = flag(RMFlagGroup.JUDGE)
PROCESS = flag(RMFlagGroup.PROCESS)
TRAINING = flag(RMFlagGroup.TRAINING)
BACKEND = flag(RMFlagGroup.BACKEND)
OUTPUT = flag(RMFlagGroup.OUTPUT)


@attrs.frozen(kw_only=True)
class RMTrainConfig:
    """Everything ``lrft train-rm`` does; each field's docstring is its flag's help."""

    # model and data ------------------------------------------------------------------------
    pretrain: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """The model folder to start from: a causal LM (a scalar RM gets a new one-output score
    head; a judge trains as it is) or a reward model to train further. Unset: the built-in demo
    (a scalar RM on the demo model, from synthetic addition preferences)."""
    dataset: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """Training rows: a .jsonl/.json/.parquet file or a datasets folder."""
    eval_dataset: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """Held-out rows: loss and accuracy at every ``eval_steps`` and at the end."""
    max_samples: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=MODEL_AND_DATA
    )
    """Read only the first N training rows."""
    eval_max_samples: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=MODEL_AND_DATA
    )
    """Read only the first N held-out rows."""
    prompt_key: str = attrs.field(default="prompt", metadata=MODEL_AND_DATA)
    """The column holding the prompt."""
    chosen_key: str = attrs.field(default="chosen", metadata=MODEL_AND_DATA)
    """Scalar: the column holding the preferred response."""
    rejected_key: str = attrs.field(default="rejected", metadata=MODEL_AND_DATA)
    """Scalar: the column holding the other response."""
    margin_key: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """Scalar: a column of per-pair margins: the loss asks r_chosen - r_rejected to exceed it."""
    apply_chat_template: bool = attrs.field(default=False, metadata=MODEL_AND_DATA)
    """Scalar: format the prompt column with the tokenizer's chat template (as lrft train
    --apply_chat_template does). Generative: wrap the judge prompt in the judge's chat template
    (as lrft train --grm_apply_chat_template does)."""
    input_template: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """A template with one ``{}`` for the prompt text."""
    max_len: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=MODEL_AND_DATA
    )
    """Drop (and count) examples with more tokens; never truncates."""
    # judge training ------------------------------------------------------------------------
    generative: bool = attrs.field(default=False, metadata=JUDGE)
    """Train a generative judge on (prompt, response, verdict) rows instead of a scalar RM."""
    response_key: str = attrs.field(default="response", metadata=JUDGE)
    """The column holding the judged response."""
    verdict_key: str = attrs.field(default="verdict", metadata=JUDGE)
    """The column holding the judge's verdict text."""
    reference_key: str | None = attrs.field(default=None, metadata=JUDGE)
    """The column holding the reference answer, for templates that show it."""
    grm_template: str = attrs.field(
        default="pointwise-boxed", metadata=flag(RMFlagGroup.JUDGE, metavar="NAME|FILE")
    )
    """The judge template the judge prompts are rendered with: pointwise-boxed,
    pointwise-score-tag, pairwise-boxed or a JSON/YAML file; give lrft train the same one."""
    # process reward models ----------------------------------------------------------------
    step_separator: str | None = attrs.field(
        default=None, metadata=flag(RMFlagGroup.PROCESS, metavar="TEXT")
    )
    """Train a process reward model on step-labelled rows (prompt, steps, labels) instead: each
    row's steps joined by this text make the response, and a one-label token-classification
    head learns each step's label at its last token; give lrft train ``--prm_step_separator``
    the same (what its ``--prm_pretrain`` reads)."""
    steps_key: str = attrs.field(default="steps", metadata=PROCESS)
    """The column holding each row's list of steps."""
    step_labels_key: str = attrs.field(default="labels", metadata=PROCESS)
    """The column holding one label per step: 1 right, 0 wrong."""
    # training ------------------------------------------------------------------------------
    train_batch_size: int = attrs.field(default=32, validator=v.positive_int, metadata=TRAINING)
    """Pairs (or judge examples) per optimizer step."""
    micro_train_batch_size: int = attrs.field(
        default=8, validator=v.positive_int, metadata=TRAINING
    )
    """Examples per forward on each rank."""
    max_epochs: int = attrs.field(default=1, validator=v.positive_int, metadata=TRAINING)
    """Passes over the training rows."""
    max_steps: int | None = attrs.field(
        default=None,
        validator=f.optional_positive,
        metadata=flag(RMFlagGroup.TRAINING, kind=optional_int),
    )
    """Stop after N optimizer steps (unset: ``max_epochs`` passes)."""
    learning_rate: float = attrs.field(default=1e-5, validator=v.positive_number, metadata=TRAINING)
    """AdamW's learning rate."""
    lr_scheduler: str = attrs.field(
        default="constant",
        validator=_schedule,
        metadata=flag(RMFlagGroup.TRAINING, choices=LR_SCHEDULES),
    )
    """The learning rate after the warm-up: constant, or linear / cosine decay to 0 at the last
    step."""
    lr_warmup_steps: int = attrs.field(default=0, validator=v.non_negative_int, metadata=TRAINING)
    """Optimizer steps over which the learning rate rises linearly to its value."""
    l2: float = attrs.field(default=0.0, validator=v.non_negative, metadata=TRAINING)
    """AdamW's weight decay."""
    max_norm: float = attrs.field(default=1.0, validator=v.non_negative, metadata=TRAINING)
    """The gradient-norm clip (0: off)."""
    zero_stage: int | None = attrs.field(
        default=None,
        validator=f.zero_stage,
        metadata=flag(RMFlagGroup.BACKEND, kind=optional_int),
    )
    """Train with DeepSpeed ZeRO stage 1, 2 or 3 instead of FSDP2."""
    deepspeed_config: str | None = attrs.field(default=None, metadata=BACKEND)
    """A DeepSpeed JSON file merged into the generated config (needs ``zero_stage``)."""
    seed: int = attrs.field(default=42, metadata=TRAINING)
    """The seed of the shuffle and of a new score head."""
    # outputs -------------------------------------------------------------------------------
    save_path: str = attrs.field(default="./lrft_rm_output", metadata=OUTPUT)
    """The output folder: metrics.jsonl, curves.png, tensorboard/, run.json, hf_model/."""
    ckpt_path: str | None = attrs.field(default=None, metadata=OUTPUT)
    """The checkpoint folder (unset: SAVE_PATH/checkpoints)."""
    save_steps: int = attrs.field(default=-1, metadata=OUTPUT)
    """Checkpoint every N steps (-1: never)."""
    max_ckpt_num: int = attrs.field(default=3, validator=v.positive_int, metadata=OUTPUT)
    """Checkpoints of this run kept (the oldest removed)."""
    load_checkpoint: bool = attrs.field(default=False, metadata=OUTPUT)
    """Resume from the newest checkpoint; its settings must match but for the run's length,
    paths, checkpoint and evaluation settings."""
    overwrite_output: bool = attrs.field(default=False, metadata=OUTPUT)
    """Start a new run over another run's outputs, removing exactly those first."""
    eval_steps: int = attrs.field(default=-1, metadata=OUTPUT)
    """Evaluate every N steps (-1: at the start and the end only)."""
    use_tensorboard: bool = attrs.field(
        default=attrs.Factory(
            lambda config: config.pretrain is None and tensorboard_available(), takes_self=True
        ),
        validator=f.tensorboard_installed,
        metadata=flag(
            RMFlagGroup.OUTPUT,
            computed_default="on for the built-in demo when tensorboard is installed, else off",
        ),
    )
    """Also write the metrics as TensorBoard scalars under SAVE_PATH/tensorboard (needs
    lrft[plots]), as lrft train does."""
    collective_timeout_s: float = attrs.field(
        default=600.0, validator=v.positive_number, metadata=BACKEND
    )
    """Seconds a rank waits at a collective for the slowest rank before it fails."""

    def __attrs_post_init__(self) -> None:
        with reporting() as problems:  # both groups of rules, reported together
            problems.check_each((self._check_mode, self._check_run))

    def _check_mode(self) -> None:
        defaults = attrs.fields_dict(RMTrainConfig)
        if self.step_separator is None:
            for name in PROCESS_ONLY:
                if getattr(self, name) != defaults[name].default:
                    raise ConfigError(f"{name} {getattr(self, name)!r} applies to --step_separator")
        else:
            if self.generative or self.step_separator == "":
                raise ConfigError(
                    "step_separator trains a process reward model: a non-empty text, and not "
                    "with --generative (a judge)"
                )
            for name in SCALAR_ONLY:
                if getattr(self, name) != defaults[name].default:
                    raise ConfigError(
                        f"{name} {getattr(self, name)!r} applies to preference pairs, not to "
                        "step-labelled rows (--step_separator)"
                    )
            if self.pretrain is None:
                raise ConfigError(
                    "--step_separator needs --pretrain and --dataset (the built-in demo trains "
                    "a scalar RM)"
                )
        wrong = GENERATIVE_ONLY if not self.generative else SCALAR_ONLY
        for name in wrong:
            if getattr(self, name) != defaults[name].default:
                needs = (
                    "--generative" if not self.generative else "scalar training (no --generative)"
                )
                raise ConfigError(f"{name} {getattr(self, name)!r} applies to {needs}")
        if self.generative:
            template = self.judge_template
            if template.needs_reference and self.reference_key is None:
                raise ConfigError(
                    f"grm_template {self.grm_template!r} shows the reference answer: set "
                    "--reference_key to the column that holds it"
                )
            if self.pretrain is None:
                raise ConfigError(
                    "--generative needs --pretrain and --dataset (the built-in demo trains a "
                    "scalar RM)"
                )

    def _check_run(self) -> None:
        if self.pretrain is None and (self.dataset is not None or self.eval_dataset is not None):
            raise ConfigError(
                "dataset and eval_dataset need --pretrain (the built-in demo writes its own)"
            )
        if self.pretrain is not None and self.dataset is None:
            raise ConfigError("pretrain needs --dataset (only the built-in demo brings its own)")
        if self.load_checkpoint and self.overwrite_output:
            raise ConfigError(
                "load_checkpoint continues the run in save_path, overwrite_output replaces it "
                "with a new one: choose one"
            )
        if self.deepspeed_config is not None and self.zero_stage is None:
            raise ConfigError(
                f"deepspeed_config {self.deepspeed_config!r} needs zero_stage (1, 2 or 3): "
                "without it lrft trains with FSDP2"
            )
        if self.eval_steps > 0 and self.eval_dataset is None and self.pretrain is not None:
            raise ConfigError(f"eval_steps {self.eval_steps} needs --eval_dataset")
        if self.train_batch_size % self.micro_train_batch_size:
            raise ConfigError(
                f"micro_train_batch_size {self.micro_train_batch_size} must divide "
                f"train_batch_size {self.train_batch_size}"
            )

    @property
    def judge_template(self) -> JudgeTemplate:
        """The judge template ``grm_template`` names (read at every access: cheap)."""
        if self.grm_template in JUDGE_TEMPLATES:
            return JUDGE_TEMPLATES[self.grm_template]
        return load_judge_template(self.grm_template)

    @property
    def checkpoint_dir(self) -> str:
        return self.ckpt_path if self.ckpt_path is not None else f"{self.save_path}/checkpoints"

    def validate_world(self, world_size: int) -> None:
        """Each rank takes an equal share of every batch, in whole micro-batches."""
        share = self.micro_train_batch_size * world_size
        if self.train_batch_size % share:
            raise ConfigError(
                f"train_batch_size {self.train_batch_size} must be a multiple of "
                f"micro_train_batch_size * world_size = {self.micro_train_batch_size} * "
                f"{world_size} = {share} (every rank takes whole micro-batches of each batch)"
            )

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


RESUMABLE_RM_SETTINGS = frozenset(
    {
        "save_path",
        "ckpt_path",
        "dataset",  # its content is checked by the data fingerprint, not by the path
        "load_checkpoint",
        "overwrite_output",
        "max_steps",
        "max_epochs",
        "save_steps",
        "max_ckpt_num",
        "eval_dataset",
        "eval_max_samples",
        "eval_steps",
        "use_tensorboard",
        "collective_timeout_s",
    }
)
"""The settings a resumed ``lrft train-rm`` may change; every other must equal its checkpoint's.
The run's length (``max_steps``, ``max_epochs``) may change only under the constant schedule: a
linear or cosine one decays over the run's steps, so a resume with another length is refused
(the manifest records the schedule's length)."""
