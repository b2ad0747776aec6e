"""What the ``RolloutEngineSuite`` checks share: test models, the engine cache, the reference.

Rank-side checks run inside ``RankPool`` workers (or directly in the test process, given a
device). A worker keeps one engine per (suite class, model folder, device), because starting a
real engine takes seconds; every check first puts it back into a known state (awake, the base
weights under ``BASE_VERSION``), so checks never depend on each other's order.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, overload

import attrs
import pytest
import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel

from lrft.api import (
    CapabilityNotSupported,
    FinishReason,
    GenerationRequest,
    RolloutEngine,
)
from lrft.api.digest import tensor_digests
from lrft.testing.audio_models import save_tiny_audio_lm
from lrft.testing.conformance._registry import ROLLOUT_CHECKS
from lrft.testing.conformance._rollout_hooks import RolloutEngineHooks
from lrft.testing.distributed import current_rank_context
from lrft.testing.models import VOCAB_SIZE, save_tiny_causal_lm
from lrft.testing.reference import load_reference_model, load_reference_vlm
from lrft.testing.vision_models import save_tiny_vlm

Suite = type[RolloutEngineHooks[Any]]

#: prompts of different lengths (1 to 8 tokens), so batches need padding
PROMPTS: tuple[tuple[int, ...], ...] = (
    (5, 17, 42, 9),
    (100, 3, 77),
    (250, 251, 252, 253, 254, 8, 61, 19),
    (33,),
    (7, 7, 120, 64, 200),
)
NEW_TOKENS = 12
BASE_VERSION = 1
LOGPROB_TOLERANCE = 1e-5


@attrs.frozen(kw_only=True)
class EngineModels:
    """Hugging Face folders of one architecture: the engine serves ``base_dir``; ``other_dir``
    holds different weights (another seed) to load into it; ``tied_base_dir`` and
    ``tied_other_dir`` are the same with tied input and output embeddings; ``eos_dir`` holds
    ``base_dir``'s weights under a config that declares half the vocabulary its EOS ids
    (``EOS_IDS``), which an engine must not stop at."""

    base_dir: Path
    other_dir: Path
    tied_base_dir: Path
    tied_other_dir: Path
    vlm_dir: Path
    audio_dir: Path
    eos_dir: Path


def make_engine_models(root: Path, heads: tuple[int, int] = (4, 2)) -> EngineModels:
    """``heads``: (attention heads, key/value heads) of the tiny test models. ``vlm_dir`` is a
    tiny Qwen2-VL with its processor (``lrft.testing.vision_models``), ``audio_dir`` a tiny
    Qwen2-Audio with its processor (``lrft.testing.audio_models``)."""
    q, kv = heads
    vlm_dir = save_tiny_vlm(root / "vlm", seed=0, num_attention_heads=q, num_key_value_heads=kv)
    audio_dir = save_tiny_audio_lm(
        root / "audio", seed=0, num_attention_heads=q, num_key_value_heads=kv
    )
    folders = {
        f"{prefix}{label}_dir": save_tiny_causal_lm(
            root / f"{prefix.replace('_', '-')}{label}",
            seed=seed,
            num_attention_heads=q,
            num_key_value_heads=kv,
            tie_word_embeddings=bool(prefix),
        )
        for prefix in ("", "tied_")
        for label, seed in (("base", 0), ("other", 1))
    }
    eos_dir = declare_eos_ids(
        save_tiny_causal_lm(root / "eos", seed=0, num_attention_heads=q, num_key_value_heads=kv),
        EOS_IDS,
    )
    return EngineModels(**folders, vlm_dir=vlm_dir, audio_dir=audio_dir, eos_dir=eos_dir)


#: the EOS ids ``EngineModels.eos_dir`` declares: every even id from 4 (about half of what the
#: test models generate), so an engine that stops at its model's EOS stops within a few tokens
EOS_IDS = tuple(range(4, VOCAB_SIZE, 2))


def declare_eos_ids(model_dir: Path, eos_ids: Sequence[int]) -> Path:
    """Make ``model_dir``'s ``config.json`` and ``generation_config.json`` declare ``eos_ids``
    as the model's EOS ids (what transformers, vLLM and tokenizers read as where a model ends)."""
    for name in ("config.json", "generation_config.json"):
        path = model_dir / name
        settings = json.loads(path.read_text()) if path.is_file() else {}
        settings["eos_token_id"] = list(eos_ids)
        path.write_text(json.dumps(settings, indent=2) + "\n")
    return model_dir


# --- where a check runs -------------------------------------------------------------------------


class SuiteCheck(Protocol):
    """A rank-side check as the suite calls it: in a pool worker (``device=None``: the rank's
    own) or directly in one process, as rank 0 on ``device``."""

    __name__: str

    def __call__(
        self, suite: Suite, models: EngineModels, device: torch.device | None = None
    ) -> None: ...


RankCheck = Callable[[Suite, EngineModels, int, torch.device], None]


@overload
def rollout_check(check: RankCheck, /) -> SuiteCheck: ...
@overload
def rollout_check(*, last: bool = False) -> Callable[[RankCheck], SuiteCheck]: ...
def rollout_check(
    check: RankCheck | None = None, /, *, last: bool = False
) -> SuiteCheck | Callable[[RankCheck], SuiteCheck]:
    """Make ``check_<what>(suite, models, rank, device)`` a ``SuiteCheck`` and register it: the
    ``RolloutEngineSuite`` runs it as ``test_<what>`` (``last``: after every other check). While
    it runs, set-up failures name it (see ``ready_engine``)."""
    if check is None:
        return lambda function: ROLLOUT_CHECKS.options(last=last)(rank_check(function))
    return ROLLOUT_CHECKS(rank_check(check))


def rank_check(check: RankCheck) -> SuiteCheck:
    """Make ``check(suite, models, rank, device)`` a ``SuiteCheck`` (not registered)."""

    @functools.wraps(check)
    def run(suite: Suite, models: EngineModels, device: torch.device | None = None) -> None:
        global _RUNNING
        if device is None:
            context = current_rank_context()
            rank, device = context.rank, context.device
        else:
            rank = 0
        _RUNNING = check.__name__
        try:
            with one_thread_on_cpu(device):
                check(suite, models, rank, device)
        finally:
            _RUNNING = None

    return run


_RUNNING: str | None = None  # the check running in this process, for set-up messages


@contextlib.contextmanager
def one_thread_on_cpu(device: torch.device) -> Iterator[None]:
    # The test models are tiny: one thread computes them fastest, and several OpenMP threads
    # spinning on CPU cores that other processes share slowed these checks 8-13x (measured).
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def rank_prompts(rank: int) -> tuple[tuple[int, ...], ...]:
    """``PROMPTS`` shifted per rank, so that ranks of one pool do not all compute the same."""
    return tuple(tuple((token - 3 + 29 * rank) % 253 + 3 for token in p) for p in PROMPTS)


def group_leader(suite: Suite, rank: int) -> int:
    """The first rank of ``rank``'s TP group (``suite.tp_size`` consecutive ranks). The ranks
    of a TP group pass equal ``SamplingParams`` (the contract: the group makes one call), so a
    setting a check derives from prompts (a stop id) is derived from the leader's."""
    return rank - rank % suite.tp_size


def requests_for(prompts: Sequence[Sequence[int]]) -> list[GenerationRequest]:
    return [
        GenerationRequest(prompt_token_ids=p, request_id=f"r{i}") for i, p in enumerate(prompts)
    ]


def version_of(engine: RolloutEngine) -> int | None:
    """``engine.weights_version`` read afresh (a call, so type checkers do not narrow it across
    the engine calls that change it)."""
    return engine.weights_version


def require_capability(engine: RolloutEngine, name: str) -> None:
    """Skip (on every rank alike) unless ``engine`` declares the capability ``name``."""
    if name not in engine.capabilities.names():
        pytest.skip(f"{engine.name} engine lacks capability {name}")


# --- engine cache -------------------------------------------------------------------------------

_ENGINES: dict[tuple[type[Any], Path, str], RolloutEngine] = {}


@functools.cache
def model_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """The tensors of a folder written by ``save_tiny_causal_lm``, read with safetensors alone,
    or of one written by ``save_tiny_vlm``, in the names of the loaded transformers model.

    A transformers 5 vision-language model's parameter names differ from its checkpoint's
    (``model.language_model.layers.0...`` in the module, ``model.layers.0...`` in the file, as
    Qwen2-VL checkpoints have always been written); lrft speaks the module's names, as
    ``named_parameters()`` gives them, so the VLM's are read through transformers."""
    if (model_dir / "processor_config.json").is_file():
        model = load_reference_vlm(model_dir)
        return {name: p.detach().clone() for name, p in model.named_parameters()}
    return load_file(model_dir / "model.safetensors")


def ready_engine(
    suite: Suite, models: EngineModels, device: torch.device, model_dir: Path | None = None
) -> RolloutEngine:
    """This worker's engine for ``suite``, awake and holding the base weights as BASE_VERSION
    (``model_dir``: another model's folder, e.g. ``models.vlm_dir``, and its weights).

    A cached engine that cannot be put back into that state (a fault an earlier check found may
    have left it so; that check failed for it) is shut down and replaced by a fresh one, so each
    check fails, if it does, for its own reason. A fresh engine that cannot be set up fails the
    check with a message naming it and the step that failed."""
    folder = models.base_dir if model_dir is None else model_dir
    key = (suite, folder, str(device))
    cached = _ENGINES.pop(key, None)
    if cached is not None:
        try:
            _reset(cached, folder)
        except Exception:
            _shut_down_quietly(cached)
        else:
            _ENGINES[key] = cached
            return cached
    concern = f"setting up {_RUNNING or 'a check'} on a fresh engine of {suite.__name__}"
    try:
        engine: RolloutEngine = suite.make_engine(folder, device)
    except CapabilityNotSupported:
        raise  # an engine that cannot serve this model at all says so: the check may skip
    except Exception as error:
        raise AssertionError(
            f"{concern}: make_engine({str(folder)!r}, {device}) raised "
            f"{type(error).__name__}: {error}"
        ) from error
    try:
        _reset(engine, folder)
    except Exception as error:
        _shut_down_quietly(engine)
        raise AssertionError(f"{concern}: {type(error).__name__}: {error}") from error
    _ENGINES[key] = engine
    return engine


def _reset(engine: RolloutEngine, base_dir: Path) -> None:
    """Awake, the base weights loaded as BASE_VERSION, or an exception saying which step failed."""
    step = "wake()"
    try:
        engine.wake()
        step = f"load_weights(the base weights, version={BASE_VERSION})"
        engine.load_weights(list(model_weights(base_dir).items()), version=BASE_VERSION)
    except Exception as error:
        error.add_note(f"(raised by {step} while putting the engine into its starting state)")
        raise
    state = engine.state
    if (state.awake, state.weights_version) != (True, BASE_VERSION):
        raise AssertionError(
            f"wake() and load_weights(version={BASE_VERSION}) left the engine in {state}, not "
            f"awake with weights_version {BASE_VERSION}"
        )


def take_engine(suite: Suite, models: EngineModels, device: torch.device) -> RolloutEngine:
    """Like ``ready_engine``, but removed from the cache: for checks that shut it down."""
    engine = ready_engine(suite, models, device)
    del _ENGINES[(suite, models.base_dir, str(device))]
    return engine


def shutdown_cached_engines() -> None:
    """Shut down every engine this process keeps: for test processes that used checks directly,
    for engines that allow one instance per process, and after a failed check (a suite then
    runs this on every rank, so that the next test starts from fresh engines). Every engine is
    shut down even if one raises; the first error is raised afterwards."""
    first: Exception | None = None
    while _ENGINES:
        _, engine = _ENGINES.popitem()
        try:
            engine.shutdown()
        except Exception as error:
            first = first or error
    if first is not None:
        raise first


def _shut_down_quietly(engine: RolloutEngine) -> None:
    # Only for engines already found broken: their own failure is what gets reported.
    with contextlib.suppress(Exception):
        engine.shutdown()


# --- the reference ------------------------------------------------------------------------------


@functools.cache
def reference_model(model_dir: Path, device: torch.device) -> PreTrainedModel:
    return load_reference_model(model_dir, device)


@functools.cache
def reference_greedy(
    model_dir: Path,
    device: torch.device,
    prompt: tuple[int, ...],
    max_new_tokens: int = NEW_TOKENS,
    stop_token_ids: tuple[int, ...] = (),
    min_new_tokens: int = 0,
) -> tuple[tuple[int, ...], FinishReason]:
    """Greedy decoding by hand: a full forward pass per token (no KV cache, no padding), stop
    ids masked out before ``min_new_tokens``, ending after the first stop id or the limit."""
    model = reference_model(model_dir, device)
    ids = list(prompt)
    with torch.no_grad():
        for step in range(max_new_tokens):
            logits = model(torch.tensor([ids], device=device)).logits[0, -1]
            if step < min_new_tokens and stop_token_ids:
                logits[list(stop_token_ids)] = float("-inf")
            token = int(torch.argmax(logits).item())
            ids.append(token)
            if token in stop_token_ids:
                return tuple(ids[len(prompt) :]), "stop"
    return tuple(ids[len(prompt) :]), "length"


def reference_digests(model_dir: Path, engine: RolloutEngine) -> dict[str, str]:
    """Digests of the folder's tensors cast to the dtypes the engine says it stores."""
    specs = engine.parameter_specs()
    weights = model_weights(model_dir)
    return tensor_digests({name: weights[name].to(specs[name].dtype) for name in specs})


def backdoor_digests(suite: Suite, engine: RolloutEngine) -> dict[str, str]:
    """Digests of the weights read through the suite's backdoor, not through the engine's API."""
    return tensor_digests(suite.read_engine_weights(engine))
