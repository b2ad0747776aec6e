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


def scalar_rm_config(path: str, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """``path``'s config as a one-label classifier with a pad id; refuses a classifier with
    another number of labels (its head is not a score)."""
    config: PretrainedConfig = AutoConfig.from_pretrained(path)
    classifier = any(
        str(name).endswith("ForSequenceClassification")
        for name in getattr(config, "architectures", None) or ()
    )
    if classifier and config.num_labels != 1:
        raise ConfigError(
            f"pretrain {path!r} is a classifier with {config.num_labels} labels; a reward model "
            "has one (its logit is the score)"
        )
    config.num_labels = 1
    if config.pad_token_id is None:
        config.pad_token_id = _pad_id(tokenizer, path)
    return config


def load_scalar_rm(
    path: str, tokenizer: PreTrainedTokenizerBase, *, seed: int
) -> tuple[PreTrainedModel, PretrainedConfig]:
    """The reward model to train from folder ``path``, in fp32, and its config.

    Raises ``ConfigError`` when the architecture has no sequence-classification form, when it
    has no one-output linear ``score`` head, or when backbone weights are missing.
    """
    config = scalar_rm_config(path, tokenizer)
    model = load_with_scalar_head(
        AutoModelForSequenceClassification,
        path,
        config,
        dtype=torch.float32,
        head_name=SCORE_HEAD,
        flag="pretrain",
        form="sequence-classification",
        purpose="the score head",
        seed=seed,
    )
    model.train()
    return model, config


def load_process_rm(
    path: str, tokenizer: PreTrainedTokenizerBase, *, seed: int
) -> tuple[PreTrainedModel, PretrainedConfig]:
    """The process reward model to train from folder ``path`` (a causal LM, whose backbone's
    weights load under a new one-output token head, or a process RM), in fp32, and its config.
    Raises ``ConfigError`` as :func:`load_scalar_rm` does, and for a token classifier of
    another number of labels."""
    config: PretrainedConfig = AutoConfig.from_pretrained(path)
    token_classifier = any(
        str(name).endswith("ForTokenClassification")
        for name in getattr(config, "architectures", None) or ()
    )
    if token_classifier and config.num_labels != 1:
        raise ConfigError(
            f"pretrain {path!r} is a token classifier with {config.num_labels} labels; lrft "
            "trains process reward models of one (its logit is the step's log-odds)"
        )
    config.num_labels = 1
    # transformers' token-classification heads drop 10% of their inputs by default: the step
    # scores trained on are then those lrft train reads, as for the critic
    config.classifier_dropout = 0.0
    if config.pad_token_id is None:
        config.pad_token_id = _pad_id(tokenizer, path)
    model = load_with_scalar_head(
        AutoModelForTokenClassification,
        path,
        config,
        dtype=torch.float32,
        head_name=SCORE_HEAD,
        flag="pretrain",
        form="token-classification",
        purpose="the step-score head",
        seed=seed,
    )
    model.train()
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
