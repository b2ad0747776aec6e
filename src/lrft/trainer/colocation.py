"""The colocated phase lifecycle: which memory is where during each phase of an iteration.

Training and rollout share each rank's device. :class:`Colocation` owns the order of the phases
that move memory (docs/trainer.md, "One iteration"): wake the engine, generate, put the engine
to sleep, rewards (the rollout's last step: reward models are reloaded, then offloaded), process
rewards (a process reward model, reloaded then offloaded the same way), actor logprobs,
reference logprobs (reloading the reference model, then offloading it), teacher logprobs (the
distillation teacher, likewise), critic values, advantages, policy epochs (reloading the
optimizer state first when it is offloaded), critic epochs, weight sync into the engine. The critic phases run only for value-based
estimators; the critic's offloaded parts come back for its two phases and leave again after
them. It logs device memory at each phase boundary.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, nullcontext
from typing import TypeVar

import torch

from lrft.api.protocols import (
    FrozenModel,
    RolloutEngine,
    SplitWeightSync,
    TrainableModel,
    WeightSync,
)
from lrft.api.types import EnginePart, ModelPart, SyncReport
from lrft.dist.watchdog import PhaseWatch

logger = logging.getLogger(__name__)
T = TypeVar("T")

PHASES = (
    "generate",
    "rewards",
    "process_rewards",
    "actor_logprobs",
    "reference_logprobs",
    "teacher_logprobs",
    "critic_values",
    "advantages",
    "policy",
    "critic",
    "weight_sync",
)
CRITIC_PHASES = frozenset({"critic_values", "critic"})
"""The phases that run only when a critic is trained (value-based estimators)."""
TEACHER_PHASES = frozenset({"teacher_logprobs"})
"""The phase that runs only with a distillation teacher."""
PROCESS_REWARD_PHASES = frozenset({"process_rewards"})
"""The phase that runs only with a process reward model."""
OPTIONAL_PHASES = CRITIC_PHASES | TEACHER_PHASES | PROCESS_REWARD_PHASES


def device_memory_mb(device: torch.device) -> float:
    """Allocated device memory (CUDA), or this process's peak resident set on the CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Colocation:
    """Memory placement of one rank's engine, actor, reference and critic across the phases.

    ``sleep_level``: the engine sleeps at this level after generating (``None``: stays awake).
    ``engine``: ``None`` on the trainer ranks of a split placement, which hold no engine: the
    weight sync then sends to the rollout ranks' (a ``SplitWeightSync``).
    ``offload_reference``: the reference model lives on the host except during its pass;
    ``teacher`` and ``offload_teacher`` likewise for a distillation teacher scored in process.
    ``offload_optimizer``: the actor's optimizer state lives on the host except during the
    policy phase. ``critic_offload``: the parts of the critic (value-based estimators) that live
    on the host except during its values pass (parameters) and its epochs (all of them). ``watch``
    is told each phase, so that a collective timeout names it. Each phase runs inside :meth:`phase`, which records its wall time and the memory at its end into
    :attr:`records` (``time/<phase>_s``, ``memory/<phase>_mb``), and on CUDA the peak allocated
    inside the phase (``memory/<phase>_peak_mb``). On CUDA a phase's time includes the device
    work it queued (the device is synchronised at its end). Rollouts also record the engine's
    wake and sleep inside them (``time/engine_wake_s``, ``time/engine_sleep_s``).
    """

    def __init__(
        self,
        *,
        engine: RolloutEngine | None,
        actor: TrainableModel,
        reference: FrozenModel | None,
        sync: WeightSync,
        device: torch.device,
        sleep_level: int | None,
        offload_reference: bool,
        offload_optimizer: bool,
        critic: TrainableModel | None = None,
        critic_offload: Collection[ModelPart] = (),
        watch: PhaseWatch | None = None,
        teacher: FrozenModel | None = None,
        offload_teacher: bool = False,
    ) -> None:
        self.engine = engine
        self.watch = watch
        self.actor = actor
        self.reference = reference
        self.weight_sync = sync
        self.device = device
        self.sleep_level = sleep_level
        self.offload_reference = offload_reference and reference is not None
        self.offload_optimizer = offload_optimizer
        self.critic = critic
        self.critic_offload = tuple(critic_offload) if critic is not None else ()
        self.teacher = teacher
        self.offload_teacher = offload_teacher and teacher is not None
        self.records: dict[str, float] = {}
        self.order: list[str] = []
        if self.offload_reference and reference is not None:
            reference.offload([ModelPart.PARAMETERS])
        if self.offload_teacher and teacher is not None:
            teacher.offload([ModelPart.PARAMETERS])
        if offload_optimizer:
            actor.offload([ModelPart.OPTIMIZER])
        if critic is not None and self.critic_offload:
            critic.offload(self.critic_offload)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        on_cuda = self.device.type == "cuda"
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        # The watch names this phase in a collective timeout and in the peers' stall reports.
        with self.watch.phase(name) if self.watch is not None else nullcontext():
            yield
        if on_cuda:
            # Kernels queued in this phase would otherwise be billed to the next one.
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        memory = device_memory_mb(self.device)
        self.order.append(name)
        self.records[f"time/{name}_s"] = self.records.get(f"time/{name}_s", 0.0) + seconds
        self.records[f"memory/{name}_mb"] = memory
        if on_cuda:
            # the high-water mark inside the phase, not only what is left at its end
            peak = torch.cuda.max_memory_allocated(self.device) / 2**20
            self.records[f"memory/{name}_peak_mb"] = peak
        logger.debug("phase %s: %.3f s, device memory %.1f MiB", name, seconds, memory)

    def begin_iteration(self) -> None:
        self.records = {}
        self.order = []

    def rollout(
        self, generate: Callable[[], T], *, name: str = "generate", sleep_level: int | None = None
    ) -> T:
        """Wake the engine (weights, then KV cache), run ``generate``, sleep the engine.

        ``sleep_level`` overrides the configured level: evaluation sleeps at level 1 because no
        weight sync follows it, and level 2 would leave the next rollout stale weights.
        """
        engine = self.engine
        if engine is None:
            raise RuntimeError("this rank holds no engine: the rollout ranks generate")
        with self.phase(name):
            with self._timed("engine_wake"):
                engine.wake([EnginePart.WEIGHTS])
                engine.wake([EnginePart.KV_CACHE])
            try:
                return generate()
            finally:
                level = self.sleep_level
                if level is not None and sleep_level is not None:
                    level = min(level, sleep_level)
                if level is not None:
                    with self._timed("engine_sleep"):
                        engine.sleep(level)

    @contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        """Adds the block's seconds to ``time/<name>_s``, a part of the enclosing phase's."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            key = f"time/{name}_s"
            self.records[key] = self.records.get(key, 0.0) + time.perf_counter() - start

    def actor_pass(self, fn: Callable[[], T]) -> T:
        with self.phase("actor_logprobs"):
            return fn()

    def reference_pass(self, fn: Callable[[FrozenModel], T]) -> T | None:
        """Run ``fn`` on the reference model with its parameters reloaded; ``None`` without one."""
        if self.reference is None:
            return None
        with self.phase("reference_logprobs"):
            if self.offload_reference:
                self.reference.reload([ModelPart.PARAMETERS])
            try:
                return fn(self.reference)
            finally:
                if self.offload_reference:
                    self.reference.offload([ModelPart.PARAMETERS])

    def teacher_pass(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (the teacher's logprobs) with the teacher model's parameters reloaded
        when it is one this rank holds; a teacher service has nothing to move."""
        with self.phase("teacher_logprobs"):
            if self.offload_teacher and self.teacher is not None:
                self.teacher.reload([ModelPart.PARAMETERS])
            try:
                return fn()
            finally:
                if self.offload_teacher and self.teacher is not None:
                    self.teacher.offload([ModelPart.PARAMETERS])

    def critic_pass(self, fn: Callable[[TrainableModel], T]) -> T | None:
        """Run ``fn`` on the critic with its parameters reloaded; ``None`` without a critic."""
        if self.critic is None:
            return None
        with self.phase("critic_values"):
            return self._with_critic([ModelPart.PARAMETERS], fn)

    def critic_update(self, fn: Callable[[TrainableModel], T]) -> T | None:
        """Run ``fn`` (the critic's epochs) with every offloaded critic part reloaded."""
        if self.critic is None:
            return None
        with self.phase("critic"):
            return self._with_critic(self.critic_offload, fn)

    def _with_critic(self, parts: Collection[ModelPart], fn: Callable[[TrainableModel], T]) -> T:
        assert self.critic is not None
        back = [part for part in parts if part in self.critic_offload]
        if back:
            self.critic.reload(back)
        try:
            return fn(self.critic)
        finally:
            if back:
                self.critic.offload(back)

    def plain(self, name: str, fn: Callable[[], T]) -> T:
        with self.phase(name):
            return fn()

    def policy(self, fn: Callable[[], T]) -> T:
        with self.phase("policy"):
            if self.offload_optimizer:
                self.actor.reload([ModelPart.OPTIMIZER])
            try:
                return fn()
            finally:
                if self.offload_optimizer:
                    self.actor.offload([ModelPart.OPTIMIZER])

    @contextmanager
    def optimizer_resident(self) -> Iterator[None]:
        """The optimizer states (and the critic's parameters) on the device for the block
        (checkpoint save and load)."""
        if self.offload_optimizer:
            self.actor.reload([ModelPart.OPTIMIZER])
        if self.critic is not None and self.critic_offload:
            self.critic.reload(self.critic_offload)
        try:
            yield
        finally:
            if self.offload_optimizer:
                self.actor.offload([ModelPart.OPTIMIZER])
            if self.critic is not None and self.critic_offload:
                self.critic.offload(self.critic_offload)

    def sync(self, version: int) -> SyncReport:
        """Push the actor's weights into the engine as ``version`` (wakes only its weights), or
        with no engine here, to the rollout ranks' engines."""
        with self.phase("weight_sync"):
            if self.engine is None:
                assert isinstance(self.weight_sync, SplitWeightSync)
                return self.weight_sync.sync(self.actor, None, version=version)
            return self.weight_sync.sync(self.actor, self.engine, version=version)
