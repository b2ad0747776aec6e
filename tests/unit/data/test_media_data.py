"""Prompt data with images: every source kind, placement in the chat, expanded ids, and errors
that name the row and the file.

Image token counts are computed by hand: the tiny Qwen2-VL's processor cuts an image into
14 x 14 patches after resizing it to multiples of 28 pixels, and merges 2 x 2 patches into one
token, so 28 x 28 is 1 token, 56 x 56 is 4 and 56 x 84 is 6.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from lrft.api import ConfigError
from lrft.data import (
    MediaProcessor,
    PromptDataConfig,
    PromptDataError,
    load_prompt_dataset,
)
from lrft.testing.vision_models import (
    IMAGE_TOKEN_ID,
    MERGE_SIZE,
    save_processor_files,
    vlm_tokenizer,
)
from tests.unit.data.test_sources import write_jsonl, write_parquet

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def processor(tmp_path_factory: pytest.TempPathFactory) -> MediaProcessor:
    folder = tmp_path_factory.mktemp("vlm-processor")
    save_processor_files(folder, vlm_tokenizer())
    return MediaProcessor.from_pretrained(folder)


def _png(path: Path, size: tuple[int, int], color: tuple[int, int, int] = (200, 30, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def _png_bytes(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (10, 200, 10)).save(buffer, format="PNG")
    return buffer.getvalue()


def _config(path: Path, **overrides: Any) -> PromptDataConfig:
    settings: dict[str, Any] = {
        "prompt_data": path,
        "input_key": "question",
        "label_key": "answer",
        "images_key": "images",
        "apply_chat_template": True,
    }
    return PromptDataConfig(**{**settings, **overrides})


def _image_tokens(ids: tuple[int, ...]) -> int:
    return sum(1 for token in ids if token == IMAGE_TOKEN_ID)


def test_jsonl_paths_relative_to_the_file_markers_and_text_rows(
    tmp_path: Path, processor: MediaProcessor
) -> None:
    _png(tmp_path / "sets" / "img" / "a.png", (56, 56))
    _png(tmp_path / "sets" / "img" / "b.png", (84, 56))  # width 84, height 56
    absolute = _png(tmp_path / "elsewhere" / "c.png", (28, 28))
    rows: list[dict[str, Any]] = [
        {"question": "sum?", "answer": "1", "images": ["img/a.png"]},
        {"question": "<image> vs <image>", "answer": "2", "images": ["img/b.png", str(absolute)]},
        {"question": "no picture", "answer": "3", "images": []},
        {"question": "one", "answer": "4", "images": "img/a.png"},
    ]
    path = write_jsonl(tmp_path / "sets" / "train.jsonl", rows)  # images relative to sets/
    dataset = load_prompt_dataset(_config(path), processor.tokenizer, processor)

    first, second, text_only, _single = dataset.samples
    assert first.prompt_text == f"u:{PLACEHOLDER}sum?;a:"  # no marker: the image comes first
    assert second.prompt_text == f"u:{PLACEHOLDER} vs {PLACEHOLDER};a:"
    assert text_only.prompt_text == "u:no picture;a:"
    assert [_image_tokens(s.prompt_token_ids) for s in dataset.samples] == [4, 6 + 1, 0, 4]
    assert [len(s.images) for s in dataset.samples] == [1, 2, 0, 1]
    assert "images" not in first.metadata
    # the text row's ids are the tokenizer's, the others the processor's expansion of the text
    assert text_only.prompt_token_ids == tuple(processor.tokenizer.encode("u:no picture;a:"))
    assert all(sample.media is None for sample in dataset.samples)

    chosen = dataset.select([1, 2])
    media = chosen[0].media
    assert media is not None
    assert media.processed is not None
    assert media.processed.prompt_token_ids == second.prompt_token_ids
    assert [image.size for image in media.images] == [(84, 56), (28, 28)]
    grid = media.processed.tensors["image_grid_thw"].tolist()
    assert grid == [[1, 4, 6], [1, 2, 2]]  # (t, h, w) in 14-pixel patches
    patches = media.processed.tensors["pixel_values"].shape[0]
    assert patches == 4 * 6 + 2 * 2
    types = media.processed.token_tensors["mm_token_type_ids"].tolist()
    assert types == [int(t == IMAGE_TOKEN_ID) for t in second.prompt_token_ids]
    assert sum(h * w for _, h, w in grid) // MERGE_SIZE**2 == _image_tokens(second.prompt_token_ids)
    assert chosen[1].media is None


def test_parquet_bytes_records_and_datasets_image_columns(
    tmp_path: Path, processor: MediaProcessor
) -> None:
    datasets = pytest.importorskip("datasets")
    _png(tmp_path / "pics" / "p.png", (28, 28))
    rows: list[dict[str, Any]] = [
        {"question": "a", "answer": "1", "images": [_png_bytes((56, 56))]},
        {"question": "b", "answer": "2", "images": [{"bytes": None, "path": "pics/p.png"}]},
        {"question": "c", "answer": "3", "images": [{"bytes": _png_bytes((28, 28)), "path": None}]},
    ]
    write_parquet(tmp_path / "bytes.parquet", rows[:1])
    parquet = write_parquet(tmp_path / "train.parquet", rows[1:])
    from_bytes = load_prompt_dataset(
        _config(tmp_path / "bytes.parquet"), processor.tokenizer, processor
    )
    assert _image_tokens(from_bytes.samples[0].prompt_token_ids) == 4
    from_records = load_prompt_dataset(_config(parquet), processor.tokenizer, processor)
    assert [_image_tokens(s.prompt_token_ids) for s in from_records.samples] == [1, 1]

    features = datasets.Features(
        {
            "question": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "images": datasets.List(datasets.Image()),
        }
    )
    pictures = [[Image.new("RGB", (56, 56), (1, 2, 3))], [Image.new("RGB", (84, 56))]]
    table = datasets.Dataset.from_dict(
        {"question": ["x", "y"], "answer": ["1", "2"], "images": pictures}, features=features
    )
    folder = tmp_path / "saved"
    table.save_to_disk(str(folder))
    saved = load_prompt_dataset(_config(folder), processor.tokenizer, processor)
    assert [_image_tokens(s.prompt_token_ids) for s in saved.samples] == [4, 6]
    media = saved.select([0])[0].media
    assert media is not None
    first_image = media.images[0]
    assert isinstance(first_image, Image.Image)
    assert first_image.getpixel((3, 3)) == (1, 2, 3)


def test_pil_images_in_rows_are_taken_as_they_are(processor: MediaProcessor) -> None:
    from lrft.data.images import image_sources, read_image

    picture = Image.new("RGB", (28, 28), (9, 9, 9))
    (source,) = image_sources(picture, base=Path("."), where="row 0", key="images")
    assert read_image(source, max_pixels=10_000, where="row 0").getpixel((0, 0)) == (9, 9, 9)


@pytest.mark.parametrize(
    ("images", "overrides", "message"),
    [
        (
            ["gone.png"],
            {},
            r"train.jsonl row 1 \(line 2\), 'images' item 0: image 'gone.png' \(.*gone.png\) does not exist",
        ),
        (
            ["bad.png"],
            {},
            r"row 1 \(line 2\), 'images' item 0: image 'bad.png' .* is not a readable image",
        ),
        (
            ["big.png"],
            {"max_image_pixels": 3000},
            r"row 1 .*'big.png' .* has 56 x 56 = 3136 pixels, more than max_image_pixels=3000",
        ),
        (
            ["ok.png", "ok.png"],
            {"limit_mm_image_per_prompt": 1},
            r"row 1 \(line 2\): 2 images, more than limit_mm_image_per_prompt=1",
        ),
        ([7], {}, r"row 1 \(line 2\), 'images' item 0: an image must be a path, bytes"),
    ],
)
def test_bad_images_name_the_row_and_the_file(
    tmp_path: Path,
    processor: MediaProcessor,
    images: list[object],
    overrides: dict[str, Any],
    message: str,
) -> None:
    _png(tmp_path / "ok.png", (28, 28))
    _png(tmp_path / "big.png", (56, 56))
    (tmp_path / "bad.png").write_bytes(b"not an image at all")
    rows: list[dict[str, Any]] = [
        {"question": "fine", "answer": "1", "images": ["ok.png"]},
        {"question": "broken", "answer": "2", "images": images},
    ]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(PromptDataError, match=message):
        load_prompt_dataset(_config(path, **overrides), processor.tokenizer, processor)


def test_truncated_image_fails_at_load(tmp_path: Path, processor: MediaProcessor) -> None:
    whole = _png(tmp_path / "whole.png", (56, 56)).read_bytes()
    (tmp_path / "cut.png").write_bytes(whole[: len(whole) // 2])
    path = write_jsonl(
        tmp_path / "t.jsonl", [{"question": "q", "answer": "a", "images": ["cut.png"]}]
    )
    with pytest.raises(
        PromptDataError,
        match=r"row 0 .*'cut.png' .* (could not be decoded|is not a readable image)",
    ):
        load_prompt_dataset(_config(path), processor.tokenizer, processor)


def test_markers_must_match_the_images(tmp_path: Path, processor: MediaProcessor) -> None:
    _png(tmp_path / "ok.png", (28, 28))
    rows = [{"question": "<image> and <image>", "answer": "1", "images": ["ok.png"]}]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(PromptDataError, match=r"row 0 \(line 1\): the prompt marks 2 image place"):
        load_prompt_dataset(_config(path), processor.tokenizer, processor)


def test_chat_messages_with_image_parts(tmp_path: Path, processor: MediaProcessor) -> None:
    _png(tmp_path / "ok.png", (28, 28))
    chat = [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]}]
    path = write_jsonl(
        tmp_path / "t.jsonl", [{"question": chat, "answer": "1", "images": ["ok.png"]}]
    )
    (sample,) = load_prompt_dataset(_config(path), processor.tokenizer, processor).samples
    assert sample.prompt_text == f"u:look{PLACEHOLDER};a:"


def test_images_key_needs_the_processor_and_the_chat_template(
    tmp_path: Path, processor: MediaProcessor
) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"question": "q", "answer": "a", "images": []}])
    with pytest.raises(ConfigError, match="images_key='images' needs apply_chat_template=True"):
        _config(path, apply_chat_template=False)
    with pytest.raises(ConfigError, match="needs the model's processor"):
        load_prompt_dataset(_config(path), processor.tokenizer, None)
    missing = write_jsonl(tmp_path / "m.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(PromptDataError, match=r"images_key 'images' is missing in .* row 0"):
        load_prompt_dataset(_config(missing), processor.tokenizer, processor)


def test_a_changed_image_is_caught_when_selected(tmp_path: Path, processor: MediaProcessor) -> None:
    image = _png(tmp_path / "ok.png", (28, 28))
    path = write_jsonl(
        tmp_path / "t.jsonl", [{"question": "q", "answer": "a", "images": ["ok.png"]}]
    )
    dataset = load_prompt_dataset(_config(path), processor.tokenizer, processor)
    before = dataset.fingerprint
    _png(image, (56, 56))
    with pytest.raises(
        PromptDataError,
        match=r"t.jsonl row 0: its media now expand to 12 prompt tokens, 9 when .* \(did a media",
    ):
        dataset.select([0])
    assert before == dataset.fingerprint
