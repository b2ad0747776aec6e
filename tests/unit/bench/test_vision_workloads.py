"""The vision-language workloads: VL1 as TRL's side was measured (the Qwen2-VL-2B shape, 448 x 448
images, 64 completions x 256 tokens), its model as transformers builds Qwen2-VL-2B, and the
benchmark's prompts with images as ``lrft train`` reads them (each prompt exactly its word
tokens and its image's tokens); bad vision workloads named with the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen2VLForConditionalGeneration

from lrft.api.errors import ConfigError
from lrft.bench import load_workload
from lrft.bench.assets import (
    FIRST_WORD_ID,
    image_tokens,
    model_folder,
    prompt_file,
    prompt_tokens,
    qwen2_vl_config,
    words_end,
)
from lrft.bench.workloads import ImageSpec

WORKLOADS = Path(__file__).parents[3] / "src/lrft/bench/workloads"


def test_vl1_is_the_workload_trl_vl1_was_measured_on() -> None:
    vl1 = load_workload("vl1")
    model, vision = vl1.model, vl1.model.vision
    assert vision is not None
    assert (model.hidden_size, model.num_hidden_layers, model.intermediate_size) == (1536, 28, 8960)
    assert (model.num_attention_heads, model.num_key_value_heads) == (12, 2)
    assert (model.vocab_size, model.tie_word_embeddings, model.saved_dtype) == (
        151936,
        True,
        "bfloat16",
    )
    assert (vision.depth, vision.embed_dim, vision.num_heads, vision.mlp_ratio) == (32, 1280, 16, 4)
    assert vl1.grpo is not None
    prompts, train = vl1.grpo.prompts, vl1.grpo.train
    assert prompts.images == ImageSpec(width=448, height=448)
    assert prompts.tokens == 32
    assert image_tokens(model, prompts.images) == 256 + 2  # 32 x 32 patches merged 2 x 2
    assert train["rollout_batch_size"] * train["n_samples_per_prompt"] == 64
    assert (train["generate_max_len"], train["micro_train_batch_size"]) == (256, 16)
    assert (train["init_kl_coef"], train["actor_learning_rate"]) == (0.0, 1e-6)
    assert (vl1.grpo.steps, vl1.grpo.steady_from) == (4, 2)


def test_vl1_has_the_size_of_qwen2_vl_2b() -> None:
    config = qwen2_vl_config(load_workload("vl1").model)
    with torch.device("meta"):
        model = Qwen2VLForConditionalGeneration(config)
    # Qwen2-VL-2B-Instruct: 2.21 B parameters (tied embeddings); its vision encoder is published
    # as 675 M (this tower with its projector: 665 M)
    assert round(sum(p.numel() for p in model.parameters()) / 1e7) == 221
    assert round(sum(p.numel() for p in model.model.visual.parameters()) / 1e7) == 67


def test_prompts_with_images_load_as_lrft_train_reads_them(tmp_path: Path) -> None:
    from lrft.data import MediaProcessor, PromptDataConfig, load_prompt_dataset

    workload = load_workload("vl-tiny")
    assert workload.grpo is not None
    spec = workload.grpo.prompts
    folder = model_folder(workload.model, tmp_path)
    data = prompt_file(spec, words_end(workload.model), tmp_path)
    processor = MediaProcessor.from_pretrained(folder)
    dataset = load_prompt_dataset(
        PromptDataConfig(prompt_data=str(data), images_key="images", apply_chat_template=True),
        processor.tokenizer,
        processor,
    )
    assert len(dataset) == spec.count
    config = json.loads((folder / "config.json").read_text())
    image_id = config["image_token_id"]
    for sample in dataset:
        ids = sample.prompt_token_ids
        assert len(ids) == prompt_tokens(spec, workload.model) == 8 + 4 + 2
        assert ids.count(image_id) == 4  # a 56 x 56 image: 2 x 2 merged patches
        words = [i for i in ids if FIRST_WORD_ID <= i < words_end(workload.model)]
        assert len(words) == spec.tokens


def _write(path: Path, **changes: object) -> str:
    data = json.loads((WORKLOADS / "vl-tiny.json").read_text())
    for dotted, value in changes.items():
        target = data
        *parents, key = dotted.split("__")
        for parent in parents:
            target = target[parent]
        if value is None:
            del target[key]
        else:
            target[key] = value
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"model__vision__mrope_section": [2, 3, 4]},
            r"mrope_section \[2, 3, 4\] must sum to half the head dim 16",
        ),
        ({"model__vision__num_heads": 3}, r"embed_dim 32 must be divisible by .*num_heads 3"),
        ({"model__vision": None}, r"grpo.prompts.images needs a model with a vision section"),
        ({"grpo__train__images_key": "x"}, r"grpo.train must not set \['images_key'\]"),
    ],
)
def test_bad_vision_workloads_are_named(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_workload(_write(tmp_path / "w.json", **changes))
