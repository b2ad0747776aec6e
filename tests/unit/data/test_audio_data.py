"""Prompt data with audio clips: sound files, bytes and records, resampling, placement in the
chat, expanded ids, and errors that name the row and the file.

Audio token counts are computed by hand from the tiny Qwen2-Audio's Whisper feature extractor
(hop 160 samples at 16 kHz): ``n`` samples give ``ceil(n / 160)`` mel frames, which the
encoder's strided convolution and pooling turn into ``((frames - 1) // 2 + 1 - 2) // 2 + 1``
tokens (0.3 s: 30 frames, 7 tokens).
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lrft.api import ConfigError
from lrft.data import MediaProcessor, PromptDataConfig, PromptDataError, load_prompt_dataset
from lrft.data.audio import audio_sources, read_audio
from lrft.testing.audio_models import (
    AUDIO_TOKEN_ID,
    FRAMES,
    HOP_LENGTH,
    MEL_BINS,
    SAMPLING_RATE,
    audio_lm_tokenizer,
    save_audio_processor_files,
)
from lrft.testing.vision_models import save_processor_files, vlm_tokenizer
from tests.unit.data.test_sources import write_jsonl, write_parquet

soundfile = pytest.importorskip("soundfile")

PLACEHOLDER = "<|audio_bos|><|AUDIO|><|audio_eos|>"


@pytest.fixture(scope="module")
def processor(tmp_path_factory: pytest.TempPathFactory) -> MediaProcessor:
    folder = tmp_path_factory.mktemp("audio-processor")
    save_audio_processor_files(folder, audio_lm_tokenizer())
    return MediaProcessor.from_pretrained(folder)


def _sine(seconds: float, rate: int, frequency: float = 440.0) -> np.ndarray:
    times = np.arange(round(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * frequency * times)).astype(np.float32)


def _write(path: Path, seconds: float, rate: int = SAMPLING_RATE, fmt: str = "WAV") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(path, _sine(seconds, rate), rate, format=fmt)
    return path


def _encoded(seconds: float, fmt: str = "FLAC") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, _sine(seconds, SAMPLING_RATE), SAMPLING_RATE, format=fmt)
    return buffer.getvalue()


def _tokens_for(samples: int) -> int:
    frames = math.ceil(samples / HOP_LENGTH)
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def _audio_tokens(ids: tuple[int, ...]) -> int:
    return sum(1 for token in ids if token == AUDIO_TOKEN_ID)


def _config(path: Path, **overrides: Any) -> PromptDataConfig:
    settings: dict[str, Any] = {
        "prompt_data": path,
        "input_key": "question",
        "label_key": "answer",
        "audios_key": "audios",
        "apply_chat_template": True,
    }
    return PromptDataConfig(**{**settings, **overrides})


def test_jsonl_wav_and_flac_paths_markers_and_text_rows(
    tmp_path: Path, processor: MediaProcessor
) -> None:
    _write(tmp_path / "sets" / "wav" / "a.wav", 0.3)
    _write(tmp_path / "sets" / "wav" / "b.flac", 0.5, fmt="FLAC")
    absolute = _write(tmp_path / "elsewhere" / "c.wav", 0.1)
    rows: list[dict[str, Any]] = [
        {"question": "what?", "answer": "1", "audios": ["wav/a.wav"]},
        {"question": "<audio> vs <audio>", "answer": "2", "audios": ["wav/b.flac", str(absolute)]},
        {"question": "no sound", "answer": "3", "audios": []},
        {"question": "one", "answer": "4", "audios": "wav/a.wav"},
    ]
    path = write_jsonl(tmp_path / "sets" / "train.jsonl", rows)  # clips relative to sets/
    dataset = load_prompt_dataset(_config(path), processor.tokenizer, processor)

    first, second, text_only, _single = dataset.samples
    assert first.prompt_text == f"u:{PLACEHOLDER}what?;a:"  # no marker: the clip comes first
    assert second.prompt_text == f"u:{PLACEHOLDER} vs {PLACEHOLDER};a:"
    assert text_only.prompt_text == "u:no sound;a:"
    want = [_tokens_for(4800), _tokens_for(8000) + _tokens_for(1600), 0, _tokens_for(4800)]
    assert [_audio_tokens(s.prompt_token_ids) for s in dataset.samples] == want == [7, 12 + 2, 0, 7]
    assert [len(s.audio) for s in dataset.samples] == [1, 2, 0, 1]
    assert "audios" not in first.metadata
    assert text_only.prompt_token_ids == tuple(processor.tokenizer.encode("u:no sound;a:"))

    chosen = dataset.select([1, 2])
    media = chosen[0].media
    assert media is not None
    assert media.processed is not None
    assert media.processed.prompt_token_ids == second.prompt_token_ids
    assert [clip.waveform.numel() for clip in media.audio] == [8000, 1600]
    features = media.processed.tensors["input_features"]
    assert tuple(features.shape) == (2, MEL_BINS, FRAMES)  # every clip padded to the window
    mask = media.processed.tensors["feature_attention_mask"]
    assert mask.sum(-1).tolist() == [50, 10]
    assert media.processed.token_tensors == {}
    assert media.processed.counts == {"audio": 2}
    assert chosen[1].media is None


def test_parquet_bytes_and_bytes_path_records(tmp_path: Path, processor: MediaProcessor) -> None:
    _write(tmp_path / "clips" / "p.wav", 0.2)
    rows: list[dict[str, Any]] = [
        {"question": "a", "answer": "1", "audios": [_encoded(0.3)]},
        {"question": "b", "answer": "2", "audios": [{"bytes": None, "path": "clips/p.wav"}]},
        {"question": "c", "answer": "3", "audios": [{"bytes": _encoded(0.1, "WAV"), "path": None}]},
    ]
    write_parquet(tmp_path / "bytes.parquet", rows[:1])
    parquet = write_parquet(tmp_path / "train.parquet", rows[1:])
    from_bytes = load_prompt_dataset(
        _config(tmp_path / "bytes.parquet"), processor.tokenizer, processor
    )
    assert _audio_tokens(from_bytes.samples[0].prompt_token_ids) == 7
    from_records = load_prompt_dataset(_config(parquet), processor.tokenizer, processor)
    assert [_audio_tokens(s.prompt_token_ids) for s in from_records.samples] == [5, 2]


def test_resampled_to_the_feature_extractors_rate_and_mixed_to_mono(tmp_path: Path) -> None:
    """An 8 kHz sine read at 16 kHz equals the same sine sampled at 16 kHz (away from the
    edges, where a band-limited resampler rings); a stereo file becomes its channels' mean."""
    path = tmp_path / "low.wav"
    soundfile.write(path, _sine(0.5, 8000), 8000, subtype="FLOAT")
    (source,) = audio_sources(path.name, base=tmp_path, where="row 0", key="audios")
    clip = read_audio(source, sampling_rate=SAMPLING_RATE, max_seconds=1.0, where="row 0")
    assert clip.sampling_rate == SAMPLING_RATE
    assert clip.waveform.numel() == 8000
    want = torch.from_numpy(_sine(0.5, SAMPLING_RATE))
    middle = slice(800, 7200)
    assert torch.allclose(clip.waveform[middle], want[middle], atol=2e-3)

    left, right = _sine(0.1, SAMPLING_RATE, 300.0), _sine(0.1, SAMPLING_RATE, 700.0)
    stereo = tmp_path / "stereo.wav"
    soundfile.write(stereo, np.stack([left, right], axis=1), SAMPLING_RATE, subtype="FLOAT")
    (source,) = audio_sources(str(stereo), base=tmp_path, where="row 0", key="audios")
    clip = read_audio(source, sampling_rate=SAMPLING_RATE, max_seconds=None, where="row 0")
    assert torch.allclose(clip.waveform, torch.from_numpy((left + right) / 2), atol=1e-6)


@pytest.mark.parametrize(
    ("audios", "overrides", "message"),
    [
        (
            ["gone.wav"],
            {},
            r"train.jsonl row 1 \(line 2\), 'audios' item 0: audio 'gone.wav' \(.*gone.wav\) "
            "does not exist",
        ),
        (
            ["bad.wav"],
            {},
            r"row 1 \(line 2\), 'audios' item 0: audio 'bad.wav' .* is not a readable sound file",
        ),
        (
            ["long.flac"],
            {},
            r"row 1 .*'long.flac' .* lasts 1.500 s, longer than the model's feature-extractor "
            r"window of 1 s",
        ),
        (
            ["ok.wav", "ok.wav"],
            {"limit_mm_audio_per_prompt": 1},
            r"row 1 \(line 2\): 2 audio clips, more than limit_mm_audio_per_prompt=1",
        ),
        ([7], {}, r"row 1 \(line 2\), 'audios' item 0: an audio clip must be a path, bytes"),
    ],
)
def test_bad_clips_name_the_row_and_the_file(
    tmp_path: Path,
    processor: MediaProcessor,
    audios: list[object],
    overrides: dict[str, Any],
    message: str,
) -> None:
    _write(tmp_path / "ok.wav", 0.2)
    _write(tmp_path / "long.flac", 1.5, fmt="FLAC")
    (tmp_path / "bad.wav").write_bytes(b"RIFF but not really a sound file")
    rows: list[dict[str, Any]] = [
        {"question": "fine", "answer": "1", "audios": ["ok.wav"]},
        {"question": "broken", "answer": "2", "audios": audios},
    ]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(PromptDataError, match=message):
        load_prompt_dataset(_config(path, **overrides), processor.tokenizer, processor)


def test_markers_must_match_the_clips(tmp_path: Path, processor: MediaProcessor) -> None:
    _write(tmp_path / "ok.wav", 0.2)
    rows = [{"question": "<audio> and <audio>", "answer": "1", "audios": ["ok.wav"]}]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(PromptDataError, match=r"row 0 \(line 1\): the prompt marks 2 audio place"):
        load_prompt_dataset(_config(path), processor.tokenizer, processor)


def test_chat_messages_with_audio_parts(tmp_path: Path, processor: MediaProcessor) -> None:
    _write(tmp_path / "ok.wav", 0.2)
    chat = [{"role": "user", "content": [{"type": "text", "text": "hear"}, {"type": "audio"}]}]
    path = write_jsonl(
        tmp_path / "t.jsonl", [{"question": chat, "answer": "1", "audios": ["ok.wav"]}]
    )
    (sample,) = load_prompt_dataset(_config(path), processor.tokenizer, processor).samples
    assert sample.prompt_text == f"u:hear{PLACEHOLDER};a:"


def test_audios_key_needs_a_feature_extractor_and_the_chat_template(
    tmp_path: Path, processor: MediaProcessor
) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"question": "q", "answer": "a", "audios": []}])
    with pytest.raises(ConfigError, match="audios_key='audios' needs apply_chat_template=True"):
        _config(path, apply_chat_template=False)
    with pytest.raises(ConfigError, match="images_key and audios_key are both 'audios'"):
        _config(path, images_key="audios")
    with pytest.raises(ConfigError, match="audios_key='audios' needs the model's processor"):
        load_prompt_dataset(_config(path), processor.tokenizer, None)
    vision = tmp_path / "vlm"
    save_processor_files(vision, vlm_tokenizer())
    images_only = MediaProcessor.from_pretrained(vision)
    with pytest.raises(ConfigError, match=r"audios_key='audios', but .* has no feature extractor"):
        load_prompt_dataset(_config(path), images_only.tokenizer, images_only)
    missing = write_jsonl(tmp_path / "m.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(PromptDataError, match=r"audios_key 'audios' is missing in .* row 0"):
        load_prompt_dataset(_config(missing), processor.tokenizer, processor)


def test_a_changed_clip_is_caught_when_selected(tmp_path: Path, processor: MediaProcessor) -> None:
    clip = _write(tmp_path / "ok.wav", 0.1)
    path = write_jsonl(
        tmp_path / "t.jsonl", [{"question": "q", "answer": "a", "audios": ["ok.wav"]}]
    )
    dataset = load_prompt_dataset(_config(path), processor.tokenizer, processor)
    _write(clip, 0.3)
    with pytest.raises(PromptDataError, match=r"t.jsonl row 0: its media now expand to .*ok.wav"):
        dataset.select([0])
