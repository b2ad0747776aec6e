"""The audio settings of ``lrft train``: each reaches what it acts on, and one that cannot act is
refused before any process group starts, naming the value and the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lrft.api import ConfigError
from lrft.cli import config_from_args
from lrft.models.media import audio_tower, freeze_audio_tower, load_generative_model
from lrft.testing.audio_models import save_tiny_audio_lm
from lrft.trainer.build import _policy_model
from lrft.trainer.prompts import load_prompts
from tests.installed import pretend_installed
from tests.trainer.fixtures import make_model_folder

soundfile = pytest.importorskip("soundfile")

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]


@pytest.fixture(scope="module")
def audio_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_audio_lm(tmp_path_factory.mktemp("audio-lm") / "model")


def test_audio_settings_need_what_they_act_on(
    tmp_path: Path, audio_lm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pretend_installed(monkeypatch, vllm=True)
    with pytest.raises(ConfigError, match="engine_type 'vllm': only the hf engine generates"):
        config_from_args([*MODEL, "--audios_key=a", "--apply_chat_template", "--engine_type=vllm"])
    with pytest.raises(ConfigError, match="freeze_audio_tower with lora_rank 8: LoRA keeps"):
        config_from_args([*MODEL, "--freeze_audio_tower", "--lora_rank=8"])
    with pytest.raises(ConfigError, match="audios_key 'audios' needs apply_chat_template"):
        config_from_args([*MODEL, "--audios_key=audios"])
    with pytest.raises(ConfigError, match="limit_mm_audio_per_prompt 2 needs audios_key"):
        config_from_args([*MODEL, "--limit_mm_audio_per_prompt=2"])
    with pytest.raises(ConfigError, match="audios_key 'a' with advantage_estimator 'gae': the"):
        config_from_args(
            [*MODEL, "--audios_key=a", "--apply_chat_template", "--advantage_estimator=gae"]
        )
    text_model = make_model_folder(tmp_path / "text")
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"input": "x", "audios": []}) + "\n")
    base = [f"--pretrain={text_model}", f"--prompt_data={data}", "--reward_fn=math"]
    for flags, named in (
        (["--audios_key=audios", "--apply_chat_template"], "audios_key"),
        (["--freeze_audio_tower"], "freeze_audio_tower"),
    ):
        config = config_from_args(["train", *base, *flags])
        with pytest.raises(ConfigError, match=f"{named} need an audio-language model, but .*qwen2"):
            config.validate_inputs()
    config_from_args(
        ["train", *base[1:], f"--pretrain={audio_lm}", "--freeze_audio_tower"]
    ).validate_inputs()
    with pytest.raises(ConfigError, match="freeze_vision_tower need a vision-language model"):
        config_from_args(
            ["train", *base[1:], f"--pretrain={audio_lm}", "--freeze_vision_tower"]
        ).validate_inputs()


def test_audio_flags_reach_the_data(tmp_path: Path, audio_lm: Path) -> None:
    """--audios_key and --limit_mm_audio_per_prompt are the data's."""
    from lrft.data import MediaProcessor, PromptDataError

    soundfile.write(tmp_path / "a.wav", torch.zeros(1600).numpy(), 16_000)
    rows = [{"q": "two", "clips": ["a.wav", "a.wav"], "answer": "1"}]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    processor = MediaProcessor.from_pretrained(audio_lm)
    base = [
        "train",
        f"--pretrain={audio_lm}",
        f"--prompt_data={data}",
        "--reward_fn=math",
        "--input_key=q",
        "--reference_key=answer",
        "--audios_key=clips",
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
    assert len(dataset.samples[0].audio) == 2
    assert dataset.media is not None
    too_many = config_from_args([*base, "--limit_mm_audio_per_prompt=1"])
    with pytest.raises(PromptDataError, match="2 audio clips, more than limit_mm_audio_per_prompt"):
        load_prompts(
            too_many, (str(data),), processor.tokenizer, limit=None, split=None, processor=processor
        )


def test_freeze_audio_tower_freezes_the_encoder_only(audio_lm: Path) -> None:
    model = load_generative_model(audio_lm, dtype=torch.float32)
    tower = audio_tower(model)
    assert tower is not None
    frozen = freeze_audio_tower(model)
    assert len(frozen) == sum(1 for _ in tower.parameters())
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert not any(name.startswith("model.audio_tower.") for name in trainable)
    assert any(name.startswith("model.multi_modal_projector.") for name in trainable)
    assert any(name.startswith("model.language_model.") for name in trainable)

    config = config_from_args(
        [*MODEL[:1], f"--pretrain={audio_lm}", *MODEL[2:], "--freeze_audio_tower"]
    )
    policy = _policy_model(config)
    assert {n for n, p in policy.named_parameters() if p.requires_grad} == trainable
    unfrozen = _policy_model(config_from_args([*MODEL[:1], f"--pretrain={audio_lm}", *MODEL[2:]]))
    assert any(
        n.startswith("model.audio_tower.") and p.requires_grad
        for n, p in unfrozen.named_parameters()
    )
    with pytest.raises(ValueError, match="has no audio tower"):
        freeze_audio_tower(torch.nn.Linear(2, 2))


def test_rewards_see_the_prompts_clips(audio_lm: Path) -> None:
    from collections.abc import Sequence

    from lrft.api import SamplingParams
    from lrft.backends.rollout.hf import HFRolloutEngine
    from lrft.data import PromptSample
    from lrft.rewards import RewardOutput, RewardSample
    from lrft.testing.conformance._rollout_media_checks import AUDIO, media_prompts
    from lrft.trainer.experience import ExperienceMaker

    seen: list[RewardSample] = []

    class Recording:
        name = "recording"

        def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
            seen.extend(samples)
            return RewardOutput(scores=[0.0] * len(samples))

    prompts = media_prompts(audio_lm, rank=0, kind=AUDIO)  # 1, 0, 2 and 1 clips
    engine = HFRolloutEngine.from_pretrained(audio_lm)
    results = engine.generate(
        [p.request for p in prompts], SamplingParams(temperature=0.0, max_new_tokens=2)
    )
    samples = [
        PromptSample(
            prompt_text="p", prompt_token_ids=p.request.prompt_token_ids, media=p.request.media
        )
        for p in prompts
    ]
    maker = ExperienceMaker(
        engine=engine,
        decode=lambda ids: str(list(ids)),
        reward=Recording(),
        sampling=SamplingParams(),
        estimator="group_norm",
        micro_batch_size=4,
        device=torch.device("cpu"),
    )
    maker.rate(samples, results, 1)
    assert [len(sample.audio) for sample in seen] == [1, 0, 2, 1]
    for sample, prompt in zip(seen, prompts, strict=True):
        media = prompt.request.media
        assert sample.audio == (() if media is None else media.audio)
