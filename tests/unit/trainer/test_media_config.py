"""The media settings of ``lrft train``: each has its effect, and a setting that cannot act is
refused before any process group starts, naming the value and the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lrft.api import ConfigError
from lrft.cli import config_from_args
from lrft.config import TrainConfig
from lrft.data import PromptDataConfig
from lrft.demos import demo_settings
from lrft.demos.vision.settings import VISION_DEMO_SETTINGS
from lrft.testing.vision_models import save_tiny_vlm
from lrft.trainer.prompts import load_prompts
from tests.installed import pretend_installed
from tests.trainer.fixtures import make_model_folder

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]


def test_the_vision_demo_switch_brings_its_settings() -> None:
    vision = config_from_args(["train", "--demo=vision"])
    assert vision.demo == "vision"
    for name, value in VISION_DEMO_SETTINGS.items():
        assert getattr(vision, name) == value, name
    assert config_from_args(["train"]).generate_max_len == demo_settings({})["generate_max_len"]
    assert config_from_args(["train", "--demo=vision", "--max_steps=3"]).max_steps == 3
    with pytest.raises(ConfigError, match="demo 'vision' runs only when no preset"):
        TrainConfig(demo="vision", preset="smollm2")
    with pytest.raises(ConfigError, match="demo 'pictures' is unknown"):
        TrainConfig(demo="pictures")


def test_the_vision_demo_refuses_a_model_of_the_users(tmp_path: Path) -> None:
    from lrft.demos.apply import apply_demo_or_preset

    config = config_from_args([*MODEL, "--demo=vision", f"--save_path={tmp_path}/out"])
    with pytest.raises(ConfigError, match="demo 'vision' runs only when no pretrain is given"):
        apply_demo_or_preset(config, rank=0)


def test_media_settings_need_what_they_act_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pretend_installed(monkeypatch, vllm=True)
    with pytest.raises(ConfigError, match="images_key 'images' needs apply_chat_template"):
        config_from_args([*MODEL, "--images_key=images"])
    with pytest.raises(ConfigError, match="limit_mm_image_per_prompt 2 needs images_key"):
        config_from_args([*MODEL, "--limit_mm_image_per_prompt=2"])
    with pytest.raises(ConfigError, match="engine_type 'vllm': only the hf engine generates"):
        config_from_args(
            [*MODEL, "--images_key=images", "--apply_chat_template", "--engine_type=vllm"]
        )
    with pytest.raises(ConfigError, match="freeze_vision_tower with lora_rank 8: LoRA keeps"):
        config_from_args([*MODEL, "--freeze_vision_tower", "--lora_rank=8"])
    text_model = make_model_folder(tmp_path / "text")
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"input": "x", "images": []}) + "\n")
    base = [f"--pretrain={text_model}", f"--prompt_data={data}", "--reward_fn=math"]
    for flags, named in (
        (["--images_key=images", "--apply_chat_template"], "images_key"),
        (["--freeze_vision_tower"], "freeze_vision_tower"),
    ):
        config = config_from_args(["train", *base, *flags])
        with pytest.raises(ConfigError, match=f"{named} need a vision-language model, but .*qwen2"):
            config.validate_inputs()
    vlm = save_tiny_vlm(tmp_path / "vlm")
    config_from_args(
        ["train", *base[1:], f"--pretrain={vlm}", "--freeze_vision_tower"]
    ).validate_inputs()


def test_image_flags_reach_the_data(tmp_path: Path) -> None:
    """--images_key, --limit_mm_image_per_prompt and --max_image_pixels are the data's."""
    from PIL import Image

    from lrft.data import MediaProcessor, PromptDataError

    vlm = save_tiny_vlm(tmp_path / "vlm")
    Image.new("RGB", (56, 56)).save(tmp_path / "a.png")
    rows = [{"q": "two", "pics": ["a.png", "a.png"], "answer": "1"}]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    processor = MediaProcessor.from_pretrained(vlm)
    base = [
        "train",
        f"--pretrain={vlm}",
        f"--prompt_data={data}",
        "--reward_fn=math",
        "--input_key=q",
        "--reference_key=answer",
        "--images_key=pics",
        "--apply_chat_template",
    ]
    dataset = load_prompts(
        config_from_args(base),
        (str(data),),
        processor.tokenizer,
        limit=None,
        split=None,
        processor=processor,
    )
    assert len(dataset.samples[0].images) == 2
    assert dataset.media is not None
    too_many = config_from_args([*base, "--limit_mm_image_per_prompt=1"])
    with pytest.raises(PromptDataError, match="2 images, more than limit_mm_image_per_prompt=1"):
        load_prompts(
            too_many, (str(data),), processor.tokenizer, limit=None, split=None, processor=processor
        )
    too_big = config_from_args([*base, "--max_image_pixels=100"])
    with pytest.raises(PromptDataError, match="more than max_image_pixels=100"):
        load_prompts(
            too_big, (str(data),), processor.tokenizer, limit=None, split=None, processor=processor
        )
    assert PromptDataConfig(prompt_data=str(data)).images_key is None


def test_the_vllm_engine_refuses_a_vision_language_model_before_starting(tmp_path: Path) -> None:
    from lrft.api import CapabilityNotSupported
    from lrft.backends.rollout.vllm import VLLMRolloutEngine

    vlm = save_tiny_vlm(tmp_path / "vlm")
    # raised before vLLM is imported: this venv need not have it
    with pytest.raises(CapabilityNotSupported, match="'qwen2_vl' model with a vision tower") as e:
        VLLMRolloutEngine(vlm)
    assert e.value.capability == "images"
