"""The models ``lrft train-rm`` trains: a scalar reward model (a sequence-classification head with
one output, the score), a process reward model (a token-classification head with one output,
each step's log-odds) or a judge (a causal LM), and how each is exported.

A scalar RM is a transformers ``*ForSequenceClassification`` model with ``num_labels=1``: the
form ``lrft train --reward_pretrain`` loads (:class:`lrft.rewards.SequenceClassifierReward` reads
its logit), whose head reads the last token that is not padding. From a causal LM folder the
backbone's weights load and the head ``score`` starts small and seeded; from a reward-model folder
both load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from lrft.api.errors import ConfigError
from lrft.models.scalar_head import load_with_scalar_head

SCORE_HEAD = "score"
"""The score head's module name in transformers' decoder sequence-classification models."""


def _pad_id(tokenizer: PreTrainedTokenizerBase, path: str) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ConfigError(
            f"pretrain {path!r}: the tokenizer has neither a pad nor an end-of-sequence token, "
            "which the reward model's head needs to find each sequence's last token"
        )
    return int(pad)


def one_label_config(
    path: str, tokenizer: PreTrainedTokenizerBase, *, classifier: str, what: str
) -> PretrainedConfig:
    """``path``'s config with one label and a pad id; refuses a folder of the ``classifier``
    architecture (``ForSequenceClassification``...) with another number of labels, whose head
    is not ``what``."""
    config: PretrainedConfig = AutoConfig.from_pretrained(path)
    architectures = getattr(config, "architectures", None) or ()
    if any(str(name).endswith(classifier) for name in architectures) and config.num_labels != 1:
        raise ConfigError(
            f"pretrain {path!r} is a {classifier} model with {config.num_labels} labels; lrft "
            f"trains {what} of one"
        )
    config.num_labels = 1
    if config.pad_token_id is None:
        config.pad_token_id = _pad_id(tokenizer, path)
    return config


def scalar_rm_config(path: str, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """``path``'s config as a one-label classifier with a pad id; refuses a classifier with
    another number of labels (its head is not a score)."""
    return one_label_config(
        path,
        tokenizer,
        classifier="ForSequenceClassification",
        what="reward models (its logit is the score)",
    )


def _with_head(
    auto_class: Any,
    path: str,
    config: PretrainedConfig,
    *,
    form: str,
    purpose: str,
    seed: int,
    announce: Callable[[str], None] | None,
) -> PreTrainedModel:
    model = load_with_scalar_head(
        auto_class,
        path,
        config,
        dtype=torch.float32,
        head_name=SCORE_HEAD,
        flag="pretrain",
        form=form,
        purpose=purpose,
        seed=seed,
        announce=announce,
    )
    model.train()
    return model


def load_scalar_rm(
    path: str,
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int,
    announce: Callable[[str], None] | None = None,
) -> tuple[PreTrainedModel, PretrainedConfig]:
    """The reward model to train from folder ``path``, in fp32, and its config.

    ``announce`` gets one line when the score head is new (a causal-LM folder).
    Raises ``ConfigError`` when the architecture has no sequence-classification form, when it
    has no one-output linear ``score`` head, or when backbone weights are missing.
    """
    config = scalar_rm_config(path, tokenizer)
    model = _with_head(
        AutoModelForSequenceClassification,
        path,
        config,
        form="sequence-classification",
        purpose="the score head",
        seed=seed,
        announce=announce,
    )
    return model, config


def load_process_rm(
    path: str,
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int,
    announce: Callable[[str], None] | None = None,
) -> tuple[PreTrainedModel, PretrainedConfig]:
    """The process reward model to train from folder ``path`` (a causal LM, whose backbone's
    weights load under a new one-output token head, or a process RM), in fp32, and its config.
    ``announce`` gets one line when the head is new. Raises ``ConfigError`` as
    :func:`load_scalar_rm` does, and for a token classifier of another number of labels."""
    config = one_label_config(
        path,
        tokenizer,
        classifier="ForTokenClassification",
        what="process reward models (its logit is the step's log-odds)",
    )
    # transformers' token-classification heads drop 10% of their inputs by default: the step
    # scores trained on are then those lrft train reads, as for the critic
    config.classifier_dropout = 0.0
    model = _with_head(
        AutoModelForTokenClassification,
        path,
        config,
        form="token-classification",
        purpose="the step-score head",
        seed=seed,
        announce=announce,
    )
    return model, config


def token_classifier_from_config(config: PretrainedConfig, dtype: torch.dtype) -> PreTrainedModel:
    """An empty token classifier of ``config``: what an exported process RM's weights are
    loaded into."""
    model: PreTrainedModel = AutoModelForTokenClassification.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]  # transformers leaves from_config unannotated
    return model


def load_judge(path: str) -> tuple[PreTrainedModel, PretrainedConfig]:
    """The causal LM to train as a judge, in fp32, and its config."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    return model, model.config


def sequence_classifier_from_config(
    config: PretrainedConfig, dtype: torch.dtype
) -> PreTrainedModel:
    """An empty classifier of ``config``: what an exported scalar RM's weights are loaded into."""
    model: PreTrainedModel = AutoModelForSequenceClassification.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]  # transformers leaves from_config unannotated
    return model
