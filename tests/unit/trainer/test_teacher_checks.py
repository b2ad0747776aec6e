"""A teacher's folder is checked before any process group starts, also when the demo brings the
student; a vision-language student needs a vision-language teacher, whose logprobs of image
rows are its own plain forward's."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch

from lrft.api.errors import ConfigError
from lrft.cli import config_from_args
from lrft.config import TrainConfig
from lrft.demos import ASSETS_DIR
from lrft.demos.apply import apply_demo_or_preset
from lrft.testing.models import byte_tokenizer, save_tiny_causal_lm, tiny_causal_lm
from lrft.testing.reference import load_reference_vlm
from lrft.testing.vision_models import save_tiny_vlm, vlm_tokenizer
from lrft.trainer.logprobs import plain_response_logprobs, response_logprobs
from lrft.trainer.preflight import check_before_start
from lrft.trainer.teacher import ModelTeacher, check_teacher_settings
from tests.trainer.fixtures import make_model_folder

OPD = "--advantage_estimator=on_policy_distillation"


def test_the_demos_student_takes_a_teacher_of_its_tokenizer_only(tmp_path: Path) -> None:
    teacher = make_model_folder(tmp_path / "teacher", seed=3)  # the demo tokenizer, other weights
    argv = ["train", OPD, f"--teacher_pretrain={teacher}", f"--save_path={tmp_path / 'a'}"]
    config = apply_demo_or_preset(config_from_args(argv), rank=0)
    assert config.pretrain == str(ASSETS_DIR)
    check_before_start(config)
    other = save_tiny_causal_lm(tmp_path / "other", seed=1)
    byte_tokenizer(["<end>", "<pad>"], eos="<end>", pad="<pad>").save_pretrained(other)
    argv = ["train", OPD, f"--teacher_pretrain={other}", f"--save_path={tmp_path / 'b'}"]
    config = apply_demo_or_preset(config_from_args(argv), rank=0)
    with pytest.raises(
        ConfigError, match=r"teacher_pretrain .*other.* does not share the student's tokenizer"
    ):
        check_before_start(config)


def test_an_image_run_needs_a_teacher_with_a_vision_tower(tmp_path: Path) -> None:
    student = save_tiny_vlm(tmp_path / "student")
    text_teacher = tmp_path / "text"
    tiny_causal_lm(seed=2).save_pretrained(text_teacher)
    vlm_tokenizer().save_pretrained(text_teacher)
    config = TrainConfig(
        pretrain=str(student),
        prompt_data="p.jsonl",
        reward_fn="math",
        images_key="images",
        apply_chat_template=True,
        advantage_estimator="on_policy_distillation",
        teacher_pretrain=str(text_teacher),
    )
    with pytest.raises(
        ConfigError, match=r"has no vision_config: the prompts carry media \(images_key\)"
    ):
        check_teacher_settings(config)
    check_teacher_settings(
        attrs.evolve(config, teacher_pretrain=str(save_tiny_vlm(tmp_path / "vl", seed=4)))
    )


@attrs.frozen
class _Held:
    """A model held as a train backend's frozen handle holds it."""

    module: torch.nn.Module


def test_a_vision_language_teacher_scores_image_rows_with_its_own_forward(tmp_path: Path) -> None:
    from lrft.testing.conformance._rollout_media_checks import media_prompts
    from tests.unit.trainer.test_media_training import _sampled, _sequences

    student = save_tiny_vlm(tmp_path / "student")
    teacher_dir = save_tiny_vlm(tmp_path / "teacher", seed=4)
    prompts = media_prompts(student, rank=0)
    sequences = _sequences(_sampled(student, prompts), prompts)
    model = load_reference_vlm(teacher_dir)
    teacher = ModelTeacher(
        model=_Held(module=model),  # type: ignore[arg-type]  # the one attribute the score reads
        score=lambda held, rows: response_logprobs(
            held.module, rows, temperature=1.0, device=torch.device("cpu")
        ),
    )
    with torch.no_grad():
        got = teacher.logprobs(sequences)
        plain = plain_response_logprobs(
            model, sequences, temperature=1.0, device=torch.device("cpu")
        )
        student_model = load_reference_vlm(student)
        other = plain_response_logprobs(
            student_model, sequences, temperature=1.0, device=torch.device("cpu")
        )
    torch.testing.assert_close(got, plain, atol=2e-6, rtol=0)
    assert (got - other).abs().max() > 1e-3  # the teacher's own weights, not the student's
