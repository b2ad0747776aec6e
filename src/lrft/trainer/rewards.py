"""The reward a :class:`TrainConfig` asks for: rule functions, reward models, reward services.

``reward_fn``, each ``reward_pretrain`` folder, each ``grm_pretrain`` judge
(:mod:`lrft.trainer.judges`) and each ``remote_rm_url`` is one reward; with more than one (or a
weight other than 1) they are summed with ``reward_weights`` by a
:class:`~lrft.rewards.CombinedReward` whose routes cover every label of the data, so every
reward scores every sample and the metrics keep each part's own score (``reward/<name>``);
``reward_recipes`` gives each label its own weighted sum instead (:mod:`lrft.trainer.recipes`).

Reward models are wrapped by the train backend like the reference model (sharded, and with
``enable_engine_sleep`` their parameters stay on the host outside the reward phase, reloaded
one model at a time while it scores). A sharded model's forward is collective, so
:class:`ColocatedRewardModel` pads every rank's batch to the largest one before scoring.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from lrft.api.errors import ConfigError
from lrft.api.protocols import FrozenModel, TrainBackend
from lrft.api.types import ModelPart
from lrft.config import TrainConfig
from lrft.data import PromptDataset
from lrft.dist import max_over_ranks
from lrft.models.packed_attention import use_packed_attention
from lrft.rewards import (
    CombinedReward,
    MathVerifyReward,
    PerSampleReward,
    RewardError,
    RewardFn,
    RewardOutput,
    RewardSample,
    SequenceClassifierReward,
    Weighted,
)
from lrft.rewards.batch_function import BatchFunctionReward, batch_parameters
from lrft.trainer.judges import check_judge_folder, load_judge
from lrft.trainer.recipes import read_recipes, recipe_routes


def load_reward(spec: str, reference_key: str | None) -> RewardFn:
    """``math`` or ``module:function``: a function scoring one ``RewardSample``, a function of
    whole batches with LightRFT's argument names (``reward_fn(responses, labels)``,
    :mod:`lrft.rewards.batch_function`), or a ``RewardFn`` object (anything with ``name`` and a
    batch ``__call__``)."""
    if spec == "math":
        if reference_key is None:
            raise ConfigError("--reward_fn math compares with the reference: set --reference_key")
        return MathVerifyReward()
    module_name, _, attribute = spec.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"--reward_fn {spec!r} cannot be imported: {error}") from error
    if isinstance(target, RewardFn):
        return target
    if callable(target):
        arguments = batch_parameters(target)
        if arguments is not None:
            return BatchFunctionReward(name=attribute, score=target, arguments=arguments)
        return PerSampleReward(name=attribute, score=target)
    raise ConfigError(f"--reward_fn {spec!r} is neither a function nor a RewardFn")


def check_reward_settings(config: TrainConfig) -> None:
    """What can be checked of the reward models and services before any process group starts:
    each ``reward_pretrain`` is a sequence-classification folder with one label, each
    ``grm_pretrain`` a model folder that generates, and the recipes file is well formed (the
    packages the rewards need: :mod:`lrft.config.packages`). Raises ``ConfigError`` naming the
    path."""
    for path in config.reward_pretrain:
        config_file = Path(path) / "config.json"
        if not config_file.is_file():
            raise ConfigError(f"reward_pretrain {path!r} is not a model folder (no config.json)")
        model_config = json.loads(config_file.read_text(encoding="utf-8"))
        _check_score_head(path, model_config)
        labels = _num_labels(model_config)
        if labels != 1:
            raise ConfigError(
                f"reward_pretrain {path!r} has {labels} labels; a reward model has one "
                "(a sequence-classification head with num_labels=1, whose logit is the score)"
            )
    for path in config.grm_pretrain:
        check_judge_folder(path)
    if config.reward_recipes is not None:
        read_recipes(config.reward_recipes)


SCORE_HEAD_RULE = (
    "a reward model is a *ForSequenceClassification folder with one label, whose logit is the "
    "score (lrft train-rm trains and exports one)"
)


def _check_score_head(path: str, model_config: dict[str, object]) -> None:
    # A folder saved by transformers names its architecture; the loading check below covers
    # one that does not.
    architectures = model_config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        return
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        raise ConfigError(
            f"reward_pretrain {path!r} is a {architectures[0]} folder, without a score head: "
            f"{SCORE_HEAD_RULE}"
        )


def auth_headers(variable: str) -> dict[str, str]:
    """The header that carries the token in environment variable ``variable`` (none for "")."""
    if not variable:
        return {}
    token = os.environ.get(variable)
    if not token:
        raise ConfigError(f"--remote_rm_auth_env {variable}: the variable is not set or empty")
    return {"Authorization": f"Bearer {token}"}


def _num_labels(model_config: dict[str, object]) -> int:
    # transformers writes id2label (num_labels is derived from it); older configs num_labels.
    id2label = model_config.get("id2label")
    if isinstance(id2label, dict):
        return len(id2label)
    value = model_config.get("num_labels", 2)  # transformers' default for a bare config
    return int(value) if isinstance(value, int) else 2


_FILLER = RewardSample(prompt="0", response="0")
"""Scored, then dropped, on a rank with no samples while others have some."""


@attrs.frozen(kw_only=True, eq=False)
class ColocatedRewardModel:
    """A reward model's reward whose model is wrapped by a train backend.

    Every rank calls it the same number of times (the trainer scores on every rank each
    iteration and evaluation). Collective: the ranks agree on the largest batch, and each scores
    its own samples padded to that size with copies of its last one (or a filler), then drops
    the padding; so each rank runs the same number of micro-batch forwards, which a sharded
    model needs. With ``offload``, the parameters are reloaded for the call and offloaded after.
    """

    reward: SequenceClassifierReward
    model: FrozenModel
    device: torch.device
    offload: bool

    @property
    def name(self) -> str:
        return self.reward.name

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        count = len(samples)
        try:
            target = max_over_ranks(count, self.device)
        except Exception as error:
            # A RewardError: compute_rewards must not retry sample by sample, a collective alone.
            raise RewardError(
                reward=self.name,
                detail=f"agreeing on the batch size raised {type(error).__name__}: {error}",
            ) from error
        if target == 0:
            return RewardOutput(scores=[])
        padded = list(samples) + [samples[-1] if samples else _FILLER] * (target - count)
        if self.offload:
            self.model.reload([ModelPart.PARAMETERS])
        try:
            output = self.reward(padded)
        finally:
            if self.offload:
                self.model.offload([ModelPart.PARAMETERS])
        return RewardOutput(
            scores=output.scores[:count],
            metrics={name: values[:count] for name, values in output.metrics.items()},
        )


def load_every_weight(auto_class: Any, path: str, *, flag: str, rule: str) -> Any:
    """``auto_class.from_pretrained(path)`` in fp32; a weight the folder lacks is a
    ``ConfigError`` naming ``flag``, the weights and ``rule``."""
    model, info = auto_class.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    if info["missing_keys"]:
        # transformers would start the missing weights (a head) at random: scores of noise
        raise ConfigError(
            f"{flag} {path!r} lacks the weights {sorted(info['missing_keys'])[:5]}: {rule}"
        )
    return model


def load_reward_model(
    path: str, *, name: str, backend: TrainBackend, config: TrainConfig
) -> ColocatedRewardModel:
    """The reward model in folder ``path``, wrapped by ``backend``. Collective."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_every_weight(
        AutoModelForSequenceClassification, path, flag="reward_pretrain", rule=SCORE_HEAD_RULE
    )
    if model.config.pad_token_id is None:
        # Micro-batches are right-padded; the head reads the last token that is not padding.
        pad = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        if pad is None:
            raise ConfigError(
                f"reward_pretrain {path!r}: neither the model config nor the tokenizer has a "
                "pad or end-of-sequence token to pad micro-batches with"
            )
        model.config.pad_token_id = int(pad)
    if config.packing_samples:
        use_packed_attention(model)
    frozen = backend.prepare_frozen(model)
    offload = config.enable_engine_sleep and ModelPart.PARAMETERS in backend.capabilities.offload
    if offload:
        frozen.offload([ModelPart.PARAMETERS])
    reward = SequenceClassifierReward(
        model=frozen,
        tokenizer=tokenizer,
        micro_batch_size=config.micro_rollout_batch_size,
        name=name,
        packed=config.packing_samples,
    )
    return ColocatedRewardModel(reward=reward, model=frozen, device=backend.device, offload=offload)


def data_labels(datasets: Iterable[PromptDataset | None]) -> set[str]:
    """Every label the rewards will see, as :class:`~lrft.rewards.RewardSample` spells it."""
    return {
        "" if sample.label is None else str(sample.label)
        for dataset in datasets
        if dataset is not None
        for sample in dataset
    }


def _names(kind: str, count: int) -> list[str]:
    return [kind] if count == 1 else [f"{kind}_{index}" for index in range(count)]


def build_reward(config: TrainConfig, backend: TrainBackend, labels: Iterable[str]) -> RewardFn:
    """The configured reward (see the module docstring). Collective when it loads reward
    models (every rank wraps them in the same order)."""
    rewards: list[RewardFn] = []
    if config.reward_fn is not None:
        rewards.append(load_reward(config.reward_fn, config.reference_key))
    for path, name in zip(
        config.reward_pretrain,
        _names("reward_model", len(config.reward_pretrain)),
        strict=True,
    ):
        rewards.append(load_reward_model(path, name=name, backend=backend, config=config))
    for path, name in zip(
        config.grm_pretrain, _names("grm", len(config.grm_pretrain)), strict=True
    ):
        rewards.append(load_judge(path, name=name, config=config, device=backend.device))
    if config.remote_rm_url:
        from lrft.rewards.remote import RemoteReward

        count = len(config.remote_rm_url)
        variables = config.remote_rm_auth_env or ("",) * count
        for url, name, variable in zip(
            config.remote_rm_url, _names("remote", count), variables, strict=True
        ):
            rewards.append(
                RemoteReward(
                    url=url,
                    timeout_s=config.remote_rm_timeout_s,
                    max_attempts=config.remote_rm_max_attempts,
                    headers=auth_headers(variable),
                    name=name,
                    protocol=config.remote_rm_protocol,
                    batch_size=config.remote_rm_batch_size,
                    max_concurrency=config.remote_rm_max_concurrency,
                )
            )
    if not rewards:
        raise ConfigError(
            "no reward: give reward_fn, reward_pretrain, grm_pretrain or remote_rm_url"
        )
    labels = sorted(labels) or [""]
    if config.reward_recipes is not None:
        recipes = read_recipes(config.reward_recipes)
        routes = recipe_routes(recipes, rewards, labels, path=config.reward_recipes)
    else:
        weights = config.reward_weights or (1.0,) * len(rewards)
        if len(rewards) == 1 and weights == (1.0,):
            return rewards[0]
        parts = tuple(
            Weighted(reward=reward, weight=weight)
            for reward, weight in zip(rewards, weights, strict=True)
        )
        routes = dict.fromkeys(labels, parts)
    try:
        return CombinedReward(routes=routes)
    except ValueError as error:  # two rewards under one name: their metrics would mix
        raise ConfigError(f"the rewards cannot be combined: {error}") from error


def task_reward(
    config: TrainConfig, backend: TrainBackend, labels: Iterable[str]
) -> RewardFn | None:
    """:func:`build_reward`'s reward, or ``None`` for a run that scores no sample with one:
    ``no_task_reward`` with no reward given (on-policy distillation from the teacher alone,
    which evaluates nothing)."""
    if config.no_task_reward and config.reward_count == 0:
        return None
    return build_reward(config, backend, labels)
