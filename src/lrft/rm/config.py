"""The settings of ``lrft train-rm``: one frozen record, validated whole before any process group
starts. Field names follow ``lrft train``'s where the meaning is the same (``pretrain``,
``train_batch_size``, ``zero_stage``, ``save_path``, ``load_checkpoint``...), so that the output
folders, checkpoints and resumes work, and read, alike. Errors name the value and the rule.
"""

from __future__ import annotations

from typing import Any

import attrs

from lrft.api.errors import ConfigError
from lrft.config import validators as f
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


def _non_negative_int(_: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{attribute.name} must be an integer >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class RMTrainConfig:
    """Everything ``lrft train-rm`` does; see ``lrft train-rm --help`` for each field."""

    # model and data ------------------------------------------------------------------------
    pretrain: str | None = None
    """The model folder to start from: a causal LM (a scalar RM gets a new one-output score
    head; a judge trains as it is) or a reward model to train further. Unset: the built-in demo
    (a scalar RM on the demo model, from synthetic addition preferences)."""
    dataset: str | None = None
    """Training rows: a .jsonl/.json/.parquet file or a datasets folder."""
    eval_dataset: str | None = None
    max_samples: int | None = attrs.field(default=None, validator=f.optional_positive)
    eval_max_samples: int | None = attrs.field(default=None, validator=f.optional_positive)
    prompt_key: str = "prompt"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    margin_key: str | None = None
    """A column of per-pair margins: the loss asks ``r_chosen - r_rejected`` to exceed it."""
    apply_chat_template: bool = False
    """Scalar: format the prompt column with the tokenizer's chat template (as ``lrft train
    --apply_chat_template`` does). Generative: wrap the judge prompt in the judge's chat template
    (as ``lrft train --grm_apply_chat_template`` does)."""
    input_template: str | None = None
    max_len: int | None = attrs.field(default=None, validator=f.optional_positive)
    """Drop (and count) examples with more tokens; never truncates."""
    # judge training ------------------------------------------------------------------------
    generative: bool = False
    """Train a generative judge on (prompt, response, verdict) rows instead of a scalar RM."""
    response_key: str = "response"
    verdict_key: str = "verdict"
    reference_key: str | None = None
    grm_template: str = "pointwise-boxed"
    """The judge template (a built-in name or a JSON/YAML file) the judge prompts are rendered
    with; give ``lrft train`` the same one."""
    # process reward models ----------------------------------------------------------------
    step_separator: str | None = None
    """Train a process reward model on step-labelled rows instead: each row's steps joined by
    this text make the response, and a one-label token-classification head learns each step's
    label at its last token (what ``lrft train --prm_pretrain`` reads)."""
    steps_key: str = "steps"
    step_labels_key: str = "labels"
    # training ------------------------------------------------------------------------------
    train_batch_size: int = attrs.field(default=32, validator=f.positive)
    micro_train_batch_size: int = attrs.field(default=8, validator=f.positive)
    max_epochs: int = attrs.field(default=1, validator=f.positive)
    max_steps: int | None = attrs.field(default=None, validator=f.optional_positive)
    learning_rate: float = attrs.field(default=1e-5, validator=f.positive_float)
    lr_scheduler: str = attrs.field(default="constant", validator=_schedule)
    lr_warmup_steps: int = attrs.field(default=0, validator=_non_negative_int)
    l2: float = attrs.field(default=0.0, validator=f.non_negative)
    max_norm: float = attrs.field(default=1.0, validator=f.non_negative)
    zero_stage: int | None = attrs.field(default=None, validator=f.zero_stage)
    deepspeed_config: str | None = None
    seed: int = 42
    # outputs -------------------------------------------------------------------------------
    save_path: str = "./lrft_rm_output"
    ckpt_path: str | None = None
    save_steps: int = -1
    max_ckpt_num: int = attrs.field(default=3, validator=f.positive)
    load_checkpoint: bool = False
    overwrite_output: bool = False
    eval_steps: int = -1
    collective_timeout_s: float = attrs.field(default=600.0, validator=f.positive_float)

    def __attrs_post_init__(self) -> None:
        self._check_mode()
        self._check_run()

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
        "collective_timeout_s",
    }
)
"""The settings a resumed ``lrft train-rm`` may change; every other must equal its checkpoint's.
The run's length (``max_steps``, ``max_epochs``) may change only under the constant schedule: a
linear or cosine one decays over the run's steps, so a resume with another length is refused
(the manifest records the schedule's length)."""
