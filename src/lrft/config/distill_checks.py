"""The rules of :class:`lrft.config.TrainConfig` on on-policy distillation and process rewards:
a distillation estimator has exactly one teacher and nothing else has one, the teacher service's
settings need the service, and the task reward and process rewards go where they are read. Two
groups, each run by ``TrainConfig`` at construction after the rules of
:mod:`lrft.config.checks`: :func:`check_distillation_settings` and
:func:`check_process_reward_settings`."""

from __future__ import annotations

import urllib.parse

import attrs

from lrft.algo import advantage_estimators
from lrft.api.errors import ConfigError
from lrft.config.fields import TrainFields
from lrft.redaction import redact
from lrft.rewards.retry import retry_backoff_s

TEACHER_SERVICE_SETTINGS = (
    "teacher_protocol",
    "teacher_auth_env",
    "teacher_timeout_s",
    "teacher_max_attempts",
)
"""The fields that configure the teacher service; each needs ``teacher_url``."""
PURE_DISTILLATION = "on_policy_distillation"
"""The estimator that reads no task reward: the one ``no_task_reward`` goes with."""


def _changed(config: TrainFields, name: str) -> bool:
    return bool(getattr(config, name) != attrs.fields_dict(type(config))[name].default)


def teacher_names() -> list[str]:
    return [spec.name for spec in advantage_estimators if spec.needs_teacher]


def check_distillation_settings(config: TrainFields) -> None:
    """The teacher, its service and the task reward (see the module docstring); each error
    names the settings and the rule."""
    _check_teacher(config)
    _check_teacher_service(config)
    _check_task_reward(config)


def _check_teacher(config: TrainFields) -> None:
    estimator = config.advantage_estimator
    needs_teacher = advantage_estimators.get(estimator).needs_teacher
    given = [
        name for name in ("teacher_pretrain", "teacher_url") if getattr(config, name) is not None
    ]
    if needs_teacher and not given:
        lightrft = (
            "; LightRFT passes its SGLang teacher's URL as --remote_rm_url, which is a reward "
            "service in lrft: give it as --teacher_url URL --teacher_protocol sglang"
            if config.remote_rm_url
            else ""
        )
        raise ConfigError(
            f"advantage_estimator {estimator!r} scores every sample with a teacher: give "
            "--teacher_pretrain PATH (a model folder sharing the student's tokenizer) or "
            f"--teacher_url URL (a service returning per-token logprobs){lightrft}"
        )
    if len(given) == 2:
        raise ConfigError(
            "teacher_pretrain and teacher_url both name a teacher: give one (a model scored in "
            "process, or a service)"
        )
    if given and not needs_teacher:
        raise ConfigError(
            f"{given[0]} is read only by the distillation estimators "
            f"({', '.join(teacher_names())}); advantage_estimator {estimator!r} has no teacher"
        )


def teacher_wait_s(config: TrainFields) -> float:
    """How long the teacher service keeps a rank in its phase when it never answers."""
    attempts = config.teacher_max_attempts
    waits = sum(retry_backoff_s(failed) for failed in range(1, attempts))
    return attempts * config.teacher_timeout_s + waits


def _check_teacher_service(config: TrainFields) -> None:
    if config.teacher_url is None:
        for name in TEACHER_SERVICE_SETTINGS:
            if _changed(config, name):
                raise ConfigError(f"{name} applies to teacher_url, which is not set")
        return
    if config.teacher_auth_env is not None and urllib.parse.urlsplit(config.teacher_url).username:
        raise ConfigError(
            f"teacher_url {redact(config.teacher_url)!r} has credentials in it (user:password@) "
            f"and teacher_auth_env names {config.teacher_auth_env} for it: both would set its "
            "Authorization header; give one"
        )
    if config.collective_timeout_s <= teacher_wait_s(config):
        raise ConfigError(
            f"collective_timeout_s {config.collective_timeout_s:g} must exceed the "
            f"{teacher_wait_s(config):g} s the teacher service may take when it never answers "
            f"({config.teacher_max_attempts} attempts x teacher_timeout_s "
            f"{config.teacher_timeout_s:g}, plus backoff): the other ranks wait that long"
        )
    media = [name for name in ("images_key", "audios_key") if getattr(config, name) is not None]
    if media:
        raise ConfigError(
            f"{media[0]} with teacher_url: a teacher service is sent token ids only, not the "
            "prompts' media; give a vision-language --teacher_pretrain instead"
        )
    if config.use_fire_sampling:
        raise ConfigError(
            "use_fire_sampling scores each response's first token at its own temperature, but a "
            "teacher service scores every token at one: use --teacher_pretrain"
        )


def _check_task_reward(config: TrainFields) -> None:
    estimator = config.advantage_estimator
    if config.no_task_reward and estimator != PURE_DISTILLATION:
        raise ConfigError(
            f"no_task_reward leaves advantage_estimator {estimator!r} no reward to learn from: "
            f"it goes with {PURE_DISTILLATION!r}, which learns from the teacher alone"
        )
    if config.no_task_reward and config.normalize_reward:
        raise ConfigError("normalize_reward scales task rewards, which no_task_reward turns off")
    evaluated = config.eval_dataset is not None or config.eval_split is not None
    unrewarded = config.reward_count == 0 and config.pretrain is not None and config.preset is None
    if config.no_task_reward and evaluated and unrewarded:
        raise ConfigError(
            "evaluation scores the held-out prompts with the task reward, and none is "
            "given: add a reward (reward_fn, ...) or drop eval_dataset and eval_split"
        )
    if config.dynamic_sampling and estimator == PURE_DISTILLATION:
        raise ConfigError(
            f"dynamic_sampling keeps the groups whose task rewards differ, which "
            f"{PURE_DISTILLATION!r} does not read: every sample teaches it"
        )


def check_process_reward_settings(config: TrainFields) -> None:
    """The process reward model, its separator and what they refuse; each error names the
    settings and the rule."""
    if config.prm_pretrain is None:
        if config.prm_step_separator is not None:
            raise ConfigError("prm_step_separator applies to prm_pretrain, which is not set")
        return
    if config.prm_step_separator is None:
        raise ConfigError(
            "prm_pretrain needs --prm_step_separator: the text that ends each reasoning step "
            "(where the model's scores become rewards)"
        )
    refused = {
        "normalize_reward": "it scales sequence scores, and process rewards are per token",
        "environment": "an episode's rewards are its environment's, turn by turn",
        "no_task_reward": f"{PURE_DISTILLATION!r} reads no reward, process rewards included",
        "images_key": "the model scores token ids, not the prompts' images",
        "audios_key": "the model scores token ids, not the prompts' audio",
    }
    for name, why in refused.items():
        if getattr(config, name) not in (None, False):
            raise ConfigError(f"prm_pretrain with {name}: {why}")
    if config.advantage_estimator == PURE_DISTILLATION:
        raise ConfigError(
            f"prm_pretrain with advantage_estimator {PURE_DISTILLATION!r}, which reads no "
            "reward: the process rewards would change nothing"
        )
