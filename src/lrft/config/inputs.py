"""The checks of :class:`lrft.config.TrainConfig` that read this machine: model folders,
prompt and DeepSpeed files, and the environment variables that hold reward-service credentials.

:meth:`TrainConfig.validate_inputs` runs them; ``lrft train`` calls it on every rank before any
process group starts (and ``build_trainer`` again, after a preset or the demo filled in its
paths), so every wrong path is reported at once, each naming the flag, the path and what is
missing, instead of a transformers traceback from inside a started job.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from lrft.api.errors import ConfigError
from lrft.config.fields import TrainFields
from lrft.config.knobs import prompt_sources
from lrft.config.problems import Problems, reporting

MODEL_CONFIG = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
"""The weights ``from_pretrained`` reads, whole or sharded (``<name>.index.json`` + shards)."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
)
"""Files one of which a tokenizer folder holds (fast, SentencePiece, BPE or WordPiece
vocabularies); tiktoken vocabularies end in ``.tiktoken``."""

_MODEL_FOLDER = "a Hugging Face model folder (config.json, weights, tokenizer files)"


def _weights_problem(folder: Path) -> str | None:
    """What is wrong with the folder's weights, or None when ``from_pretrained`` finds them."""
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return None
        index = folder / f"{name}.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                shards = sorted(set(weight_map.values()))
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                return f"{index.name} has no readable weight_map ({type(error).__name__})"
            missing = [shard for shard in shards if not (folder / shard).is_file()]
            if missing:
                return f"{index.name} names shard(s) that are missing: {', '.join(missing)}"
            return None
    names = ", ".join(
        name for weights in WEIGHT_FILES for name in (weights, f"{weights}.index.json")
    )
    return f"has no weights (none of {names})"


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES) or any(
        folder.glob("*.tiktoken")
    )


def check_model_folder(flag: str, path: str, *, tokenizer: bool) -> None:
    """``path`` (given as ``--flag``) is a model folder with a config, weights and, when
    ``tokenizer``, tokenizer files; raises ``ConfigError`` saying which is missing."""
    folder = Path(path)
    where = f"--{flag} {path!r}"
    if not folder.exists():
        raise ConfigError(f"{where}: no such folder (expected {_MODEL_FOLDER}){_hub_hint(path)}")
    if not folder.is_dir():
        raise ConfigError(f"{where} is a file, not a folder (expected {_MODEL_FOLDER})")
    config_file = folder / MODEL_CONFIG
    if not config_file.is_file():
        raise ConfigError(f"{where} has no {MODEL_CONFIG}: not {_MODEL_FOLDER}")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{where}: {MODEL_CONFIG} cannot be read as JSON ({error})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{where}: {MODEL_CONFIG} holds a {type(config).__name__}, not an object")
    problem = _weights_problem(folder)
    if problem is not None:
        raise ConfigError(f"{where} {problem}")
    if tokenizer and not _has_tokenizer(folder):
        raise ConfigError(
            f"{where} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}, *.tiktoken): "
            "save the tokenizer into it with tokenizer.save_pretrained(folder)"
        )


def _check_exists(flag: str, path: str | None, what: str) -> None:
    if path is not None and not Path(path).exists():
        raise ConfigError(f"--{flag} {path!r}: no such file or folder ({what}){_hub_hint(path)}")


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _hub_hint(path: str) -> str:
    """A word for a missing path shaped like a Hugging Face Hub id (``org/name``): lrft reads
    local folders and files only, and downloads nothing."""
    if not _HUB_ID.fullmatch(path) or path.startswith("."):
        return ""
    return (
        f"; {path!r} looks like a Hugging Face Hub id, but lrft reads local files and folders "
        f"only and downloads nothing: fetch it first (hf download {path} --local-dir "
        f"./{path.split('/')[-1]}, or datasets' save_to_disk for a data set) and pass that folder"
    )


_DATA = "prompt data is read from local JSONL, JSON or Parquet files or a datasets folder"


def check_auth_variables(config: TrainFields) -> None:
    """Each variable ``remote_rm_auth_env`` names is set, non-empty and one header line; the
    messages name the variable, never its value."""
    for name in config.remote_rm_auth_env:
        if not name:
            continue
        value = os.environ.get(name)
        if not value:
            raise ConfigError(
                f"--remote_rm_auth_env {name}: the environment variable {name} is "
                f"{'empty' if value == '' else 'not set'} (it holds the reward service's token; "
                "set it on every node)"
            )
        if any(character in value for character in "\r\n\0"):
            raise ConfigError(
                f"--remote_rm_auth_env {name}: the value of {name} has a line break or NUL "
                "character, which cannot go in an HTTP header"
            )


def validate_inputs(config: TrainFields) -> None:
    """See :meth:`lrft.config.TrainConfig.validate_inputs`."""
    with reporting() as problems:
        check_inputs(config, problems)


def check_inputs(config: TrainFields, problems: Problems) -> bool:
    """Report each missing or malformed input of ``config`` to ``problems``, every one of them;
    True when every model folder is one (the checks that load a model may then run)."""
    models = [("pretrain", config.pretrain, True)]
    models += [("reward_pretrain", path, True) for path in config.reward_pretrain]
    models += [("grm_pretrain", path, True) for path in config.grm_pretrain]
    models += [("teacher_pretrain", config.teacher_pretrain, True)]
    models += [("prm_pretrain", config.prm_pretrain, True)]
    # The critic is scored on the actor's tokens: it needs no tokenizer of its own.
    models.append(("critic_pretrain", config.critic_pretrain, False))
    models_ok = True
    for flag, path, tokenizer in models:
        if path is not None:
            models_ok &= problems.check(check_model_folder, flag, path, tokenizer=tokenizer)
    # each of LightRFT's comma-separated sources, named alone when it is missing
    for source in prompt_sources(config.prompt_data):
        problems.check(_check_exists, "prompt_data", source, _DATA)
    problems.check(_check_exists, "eval_dataset", config.eval_dataset, _DATA)
    problems.check(
        _check_exists, "deepspeed_config", config.deepspeed_config, "a DeepSpeed JSON file"
    )
    problems.check(
        _check_exists, "reward_recipes", config.reward_recipes, "a JSON or YAML file of recipes"
    )
    problems.check(check_auth_variables, config)
    if models_ok:
        problems.check(_check_media_model, config)
    return models_ok


def _check_media_model(config: TrainFields) -> None:
    """The settings that act on a vision or audio tower need a model with one."""
    for kind, tower, settings_on in (
        (
            "vision",
            "vision_config",
            (
                ("images_key", config.images_key is not None),
                ("freeze_vision_tower", config.freeze_vision_tower),
            ),
        ),
        (
            "audio",
            "audio_config",
            (
                ("audios_key", config.audios_key is not None),
                ("freeze_audio_tower", config.freeze_audio_tower),
            ),
        ),
    ):
        wanted = [name for name, on in settings_on if on]
        if not wanted or config.pretrain is None:
            continue
        settings = json.loads((Path(config.pretrain) / MODEL_CONFIG).read_text(encoding="utf-8"))
        if tower not in settings:
            raise ConfigError(
                f"{' and '.join(wanted)} need {'an' if kind == 'audio' else 'a'} "
                f"{kind}-language model, but pretrain "
                f"{config.pretrain!r} ({settings.get('model_type', 'unknown type')}) has no "
                f"{kind} tower (no {tower} in its config.json)"
            )
