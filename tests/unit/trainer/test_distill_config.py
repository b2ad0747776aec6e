"""The settings of on-policy distillation and process rewards: one teacher exactly where an
estimator reads one, the service's settings with the service, the task reward and process
rewards only where something reads them, and LightRFT's teacher-as-reward-URL line hinted."""

from __future__ import annotations

import pytest

from lrft.api.errors import ConfigError
from lrft.cli import config_from_args, main

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]
OPD = "--advantage_estimator=on_policy_distillation"
HYBRID = "--advantage_estimator=on_policy_distillation_hybrid"
URL = "--teacher_url=http://user:pw@127.0.0.1:9/t"


def _config(*flags: str, model: list[str] = MODEL) -> object:
    return config_from_args([*model, *flags])


def test_a_distillation_run_reads_its_teacher_and_coefficient() -> None:
    config = config_from_args([*MODEL, OPD, "--teacher_pretrain=t", "--opd_kl_coef=0.25"])
    assert config.uses_teacher
    assert config.advantage_params.opd_kl_coef == 0.25
    default = config_from_args([*MODEL, HYBRID, "--teacher_pretrain=t"])
    assert default.advantage_params.opd_kl_coef == 1.0
    assert not config_from_args(MODEL).uses_teacher


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ((OPD,), r"'on_policy_distillation' scores every sample with a teacher: give --teacher_pretrain"),
        ((OPD, "--teacher_pretrain=t", URL), "teacher_pretrain and teacher_url both name a teacher"),
        (("--teacher_pretrain=t",), r"read only by the distillation estimators \(on_policy_distillation, on_policy_distillation_hybrid\); advantage_estimator 'group_norm' has no teacher"),
        (("--opd_kl_coef=2",), "opd_kl_coef is read only by the advantage estimators on_policy_distillation, on_policy_distillation_hybrid"),
        ((OPD, "--teacher_pretrain=t", "--teacher_protocol=sglang"), "teacher_protocol applies to teacher_url, which is not set"),
        ((OPD, URL, "--teacher_auth_env=TOKEN"), r"has credentials in it .* teacher_auth_env names TOKEN"),
        ((OPD, URL, "--teacher_timeout_s=300"), r"collective_timeout_s 600 must exceed the 901.5 s the teacher service"),
        ((HYBRID, "--teacher_pretrain=t", "--no_task_reward"), r"no_task_reward leaves advantage_estimator 'on_policy_distillation_hybrid' no reward"),
        ((OPD, "--teacher_pretrain=t", "--dynamic_sampling"), "dynamic_sampling keeps the groups whose task rewards differ"),
        ((OPD, URL, "--use_fire_sampling"), "a teacher service scores every token at one"),
        (("--prm_step_separator=;",), "prm_step_separator applies to prm_pretrain"),
        (("--prm_pretrain=p",), "prm_pretrain needs --prm_step_separator"),
        (("--prm_pretrain=p", "--prm_step_separator=;", "--normalize_reward"), "prm_pretrain with normalize_reward"),
        ((OPD, "--teacher_pretrain=t", "--prm_pretrain=p", "--prm_step_separator=;"), "the process rewards would change nothing"),
    ],
)  # fmt: skip
def test_settings_that_would_be_ignored_or_contradict_are_refused(
    flags: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_args([*MODEL, *flags])


def test_no_task_reward_needs_no_reward_but_evaluation_does() -> None:
    bare = ["train", "--pretrain=m", "--prompt_data=p.jsonl"]
    config = config_from_args([*bare, OPD, "--teacher_pretrain=t", "--no_task_reward"])
    assert config.no_task_reward
    with pytest.raises(ConfigError, match="pretrain needs a reward"):
        config_from_args([*bare, OPD, "--teacher_pretrain=t"])
    with pytest.raises(ConfigError, match="evaluation scores the held-out prompts"):
        config_from_args(
            [*bare, OPD, "--teacher_pretrain=t", "--no_task_reward", "--eval_dataset=e.jsonl"]
        )


def test_the_teacher_url_is_never_shown() -> None:
    config = config_from_args([*MODEL, OPD, URL])
    assert "pw" not in repr(config)
    with pytest.raises(ConfigError) as refused:
        config_from_args([*MODEL, OPD, "--teacher_url=ftp://user:pw@host/t"])
    assert "pw" not in str(refused.value)


def test_lightrfts_distillation_line_runs_or_names_the_lrft_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # LightRFT's example: the estimator, its teacher's SGLang URL given as a reward service
    line = [
        *MODEL,
        OPD,
        "--remote_rm_url=http://127.0.0.1:13141/generate",
        "--init_kl_coef=0.01",
        "--use_kl_loss",
    ]
    assert main(line) == 2
    err = capsys.readouterr().err
    assert "--teacher_url URL --teacher_protocol sglang" in err
    fixed = [
        *line[:-3],
        "--teacher_url=http://127.0.0.1:13141/generate",
        "--teacher_protocol=sglang",
    ]
    config = config_from_args([*fixed, "--init_kl_coef=0.01", "--use_kl_loss", "--opd_kl_coef=1"])
    assert (config.teacher_protocol, config.init_kl_coef) == ("sglang", 0.01)
