"""``RMTrainer``: epochs of reward-model training over shuffled global batches, held-out
evaluation, checkpoints with exact resume, and the Hugging Face export.

The machinery is ``lrft train``'s: a :class:`~lrft.api.TrainableModel` from any
:class:`~lrft.api.TrainBackend` (FSDP2, DeepSpeed ZeRO), the resumable
:class:`~lrft.data.DistributedPromptSampler` over the examples, the atomic checkpoints of
:mod:`lrft.run.checkpoint` (model, optimizer, scheduler, RNG states; sampler position and
run id in the manifest), the run ownership of :mod:`lrft.run.outputs`, the resume rules of
:mod:`lrft.run.resume` and the metrics files of :mod:`lrft.run.metrics`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import attrs
import torch
import torch.distributed as dist

import lrft
from lrft.api.errors import ConfigError
from lrft.api.protocols import TrainableModel
from lrft.data import DistributedPromptSampler, eval_indices
from lrft.dist import max_over_ranks, sum_over_ranks
from lrft.rm.config import RESUMABLE_RM_SETTINGS, RMTrainConfig
from lrft.rm.data import ExampleSet, JudgeExample, PreferencePair, StepExample
from lrft.rm.objectives import Objective
from lrft.run import checkpoint as ckpt
from lrft.run.export import HF_MODEL_DIR
from lrft.run.metrics import Curve, CurvesPlot, MetricsWriter, report_outputs
from lrft.run.outputs import claim_outputs, own_outputs
from lrft.run.resume import check_resume_settings

E = TypeVar("E", PreferencePair, JudgeExample, StepExample)
COMMAND = "train-rm"
"""The manifest's ``command``: a checkpoint of ``lrft train`` is not resumed here."""


@attrs.frozen(kw_only=True)
class RMFitResult:
    steps: int
    first_eval: dict[str, float] | None
    last_eval: dict[str, float] | None
    seconds: float

    def summary(self) -> str:
        """The run's closing line: its steps and time, and each held-out accuracy from the
        first evaluation to the last."""
        line = f"done: {self.steps} steps in {self.seconds:.0f}s"
        if not self.first_eval or not self.last_eval:
            return f"{line} (no held-out set)"
        changes = [
            f"held-out {name.removeprefix('eval/')} {self.first_eval[name]:.3f} -> {value:.3f}"
            for name, value in self.last_eval.items()
            if name.endswith("accuracy") and name in self.first_eval
        ]
        return "; ".join([line, *changes])


def _accuracy_curves(metric: str, what: str, ylabel: str, title: str) -> CurvesPlot:
    """Training and held-out ``metric`` (``what`` names it in the legend)."""
    return CurvesPlot(
        curves=(
            Curve(kind="train", name=f"train/{metric}", label=f"training {what}"),
            Curve(kind="eval", name=f"eval/{metric}", label=f"held-out {what}"),
        ),
        ylabel=ylabel,
        title=title,
    )


RM_CURVES = _accuracy_curves(
    "accuracy",
    "pair accuracy",
    ylabel="pair accuracy (chosen scored higher)",
    title="lrft train-rm: reward model pair accuracy",
)
JUDGE_CURVES = _accuracy_curves(
    "verdict_accuracy",
    "verdict accuracy",
    ylabel="verdict accuracy (exact)",
    title="lrft train-rm --generative: judge verdict accuracy",
)


class RMTrainer(Generic[E]):
    """Trains ``model`` on ``train`` with ``objective``; see the module docstring.

    Construction does no collective work; :meth:`fit` is collective over the default group.
    ``schedule_steps`` is the length the LR schedule was built for (recorded in checkpoints);
    ``export`` writes the Hugging Face folder (collective).
    """

    def __init__(
        self,
        *,
        config: RMTrainConfig,
        model: TrainableModel,
        objective: Objective[E],
        train: ExampleSet[E],
        held_out: ExampleSet[E] | None,
        device: torch.device,
        schedule_steps: int,
        export: Callable[[Path], None],
    ) -> None:
        self.config = config
        self.model = model
        self.objective: Objective[E] = objective
        self.train: ExampleSet[E] = train
        self.held_out: ExampleSet[E] | None = held_out
        self.device = device
        self.schedule_steps = schedule_steps
        self.export = export
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.sampler = DistributedPromptSampler(
            num_samples=len(train),
            global_batch_size=config.train_batch_size,
            rank=self.rank,
            world_size=self.world_size,
            seed=config.seed,
        )
        self.metrics = MetricsWriter(
            Path(config.save_path), enabled=self.rank == 0, tensorboard=config.use_tensorboard
        )
        self.step = 0
        self.run_id: str | None = None

    @property
    def total_steps(self) -> int:
        return planned_steps(self.config, self.sampler.batches_per_epoch)

    def _say(self, message: str) -> None:
        if self.rank == 0:
            print(message, flush=True)

    # --- one step ----------------------------------------------------------------------------

    def _sums(self, counts: dict[str, float], loss_sum: float) -> tuple[dict[str, float], float]:
        names: tuple[str, ...] = self.objective.count_names
        summed = sum_over_ranks([*(counts[name] for name in names), loss_sum], self.device)
        return dict(zip(names, summed[:-1], strict=True)), summed[-1]

    def train_step(self) -> dict[str, float]:
        """One optimizer step on the next global batch; rank-summed metrics. Collective."""
        examples = [self.train[i] for i in self.sampler.next_batch().indices]
        size = self.config.micro_train_batch_size
        groups = [examples[start : start + size] for start in range(0, len(examples), size)]
        # The backend averages gradients over ranks: each rank's loss is its share of the
        # global sum over the global batch's size, times the number of ranks.
        (total,) = sum_over_ranks([float(self.objective.size(examples))], self.device)
        scale = self.world_size / max(total, 1.0)
        counts = dict.fromkeys(self.objective.count_names, 0.0)
        loss_sum = 0.0
        self.model.module.train()
        for index, group in enumerate(groups):
            measured = self.objective.measure(self.model.module, group, self.device)
            self.model.backward(measured.loss_sum * scale, sync_gradients=index == len(groups) - 1)
            loss_sum += float(measured.loss_sum.detach())
            for name, value in measured.counts.items():
                counts[name] += value
        report = self.model.step()
        totals, loss = self._sums(counts, loss_sum)
        metrics = {f"train/{k}": v for k, v in self.objective.summary(totals, loss).items()}
        metrics.update(
            {
                "train/grad_norm": report.grad_norm,
                "train/lr": report.lr,
                "train/skipped": float(report.skipped),
            }
        )
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Held-out loss and accuracy; touches no parameter, sampler or RNG state. Collective:
        every rank runs as many forwards as the rank with the most examples (a sharded model's
        forward is collective), scoring a copy of the first example in the extra ones."""
        if self.held_out is None:
            return {}
        held_out = self.held_out
        mine = [
            held_out[i]
            for i in eval_indices(len(held_out), rank=self.rank, world_size=self.world_size)
        ]
        size = self.config.micro_train_batch_size
        groups: list[Sequence[E]] = [
            mine[start : start + size] for start in range(0, len(mine), size)
        ]
        forwards = max_over_ranks(len(groups), self.device)
        counts = dict.fromkeys(self.objective.count_names, 0.0)
        loss_sum = 0.0
        self.model.module.eval()
        with torch.no_grad():
            for index in range(forwards):
                group = groups[index] if index < len(groups) else [held_out[0]]
                measured = self.objective.measure(self.model.module, group, self.device)
                if index < len(groups):
                    loss_sum += float(measured.loss_sum)
                    for name, value in measured.counts.items():
                        counts[name] += value
        self.model.module.train()
        totals, loss = self._sums(counts, loss_sum)
        return {f"eval/{k}": v for k, v in self.objective.summary(totals, loss).items()}

    # --- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        manifest: dict[str, Any] = {
            "command": COMMAND,
            "consumed_samples": self.sampler.total_consumed_samples,
            "sampler": self.sampler.state_dict(),
            "config": self.config.as_dict(),
            "lrft_version": lrft.__version__,
            "data_fingerprint": self.train.fingerprint,
            "schedule_steps": self.schedule_steps,
            "world_size": self.world_size,
            ckpt.RUN_ID: self.run_id,
        }
        return ckpt.save_checkpoint(
            Path(self.config.checkpoint_dir),
            step=self.step,
            actor=self.model,
            manifest=manifest,
            max_keep=self.config.max_ckpt_num,
        )

    def resume(self) -> bool:
        """Load the latest complete checkpoint, if any; ``True`` when one was loaded."""
        latest = ckpt.latest_checkpoint(Path(self.config.checkpoint_dir))
        if latest is None:
            self._say(f"no checkpoint under {self.config.checkpoint_dir}: starting from step 0")
            return False
        saved = ckpt.read_manifest(latest)
        check_resumable(saved, self.config, latest, self.train.fingerprint, self.schedule_steps)
        ckpt.load_checkpoint(latest, self.model)
        self.sampler.load_state_dict(saved["sampler"])
        self.step = int(saved["step"])
        run_id = saved.get(ckpt.RUN_ID)
        self.run_id = None if run_id is None else str(run_id)
        self.metrics.resume_at(self.step)
        self._say(f"resumed from {latest} at step {self.step}")
        return True

    # --- the loop ----------------------------------------------------------------------------

    def fit(self) -> RMFitResult:
        """Every step, evaluation, checkpoint and the export. Collective."""
        try:
            return self._fit()
        finally:
            self.metrics.close()

    def _fit(self) -> RMFitResult:
        start = time.perf_counter()
        removed = claim_outputs(self.config, rank=self.rank)
        if removed is not None:
            self._say(removed)
        if self.config.load_checkpoint:
            self.resume()
        self.run_id = own_outputs(Path(self.config.save_path), self.run_id, rank=self.rank)
        first = last = None
        if self.step == 0 and self.held_out is not None:
            first = last = self._evaluate_and_log()
        total = self.total_steps
        while self.step < total:
            began = time.perf_counter()
            metrics = self.train_step()
            self.step += 1
            metrics["time/step_s"] = time.perf_counter() - began
            self.metrics.log(self.step, "train", metrics)
            self._say(
                f"step {self.step}/{total}  loss {metrics['train/loss']:.4f}  "
                f"{_headline(metrics, 'train')}  {metrics['time/step_s']:.2f}s"
            )
            every = self.config.eval_steps
            if self.held_out is not None and (
                (every > 0 and self.step % every == 0) or self.step == total
            ):
                last = self._evaluate_and_log()
                first = first if first is not None else last
            if self.config.save_steps > 0 and self.step % self.config.save_steps == 0:
                self._say(f"checkpoint {self.save_checkpoint()}")
        target = Path(self.config.save_path) / HF_MODEL_DIR
        self.export(target)
        self._say(f"Hugging Face model written to {target}")
        plot = JUDGE_CURVES if self.config.generative else RM_CURVES
        report_outputs(self.metrics, Path(self.config.save_path), plot, self._say)
        return RMFitResult(
            steps=self.step, first_eval=first, last_eval=last, seconds=time.perf_counter() - start
        )

    def _evaluate_and_log(self) -> dict[str, float]:
        values = self.evaluate()
        self.metrics.log(self.step, "eval", values)
        self._say(
            f"eval at step {self.step}: loss {values['eval/loss']:.4f}  {_headline(values, 'eval')}"
        )
        return values


def _headline(metrics: dict[str, float], kind: str) -> str:
    for name in ("accuracy", "verdict_accuracy"):
        if f"{kind}/{name}" in metrics:
            return f"{name} {metrics[f'{kind}/{name}']:.3f}"
    return ""


def planned_steps(config: RMTrainConfig, batches_per_epoch: int) -> int:
    """The run's optimizer steps: ``max_epochs`` passes, cut at ``max_steps``."""
    steps = config.max_epochs * batches_per_epoch
    return steps if config.max_steps is None else min(steps, config.max_steps)


def check_resumable(
    manifest: dict[str, Any],
    config: RMTrainConfig,
    directory: Path,
    fingerprint: str,
    schedule_steps: int,
) -> None:
    """Raise ``ConfigError`` when checkpoint ``directory`` cannot be continued by this run: it
    is not ``lrft train-rm``'s, its settings differ where a resume may not change them, it was
    written for other examples, or a decaying LR schedule would change its length."""
    if manifest.get("command") != COMMAND:
        raise ConfigError(
            f"checkpoint {directory} was not written by lrft train-rm: resume it with the "
            "command that wrote it"
        )
    check_resume_settings(
        manifest,
        config,
        directory,
        resumable=RESUMABLE_RM_SETTINGS,
        command="lrft train-rm",
        docs="docs/reward-models.md",
    )
    if manifest["data_fingerprint"] != fingerprint:
        raise ConfigError(
            f"checkpoint {directory} was written for other examples (data fingerprint "
            f"{manifest['data_fingerprint']} != {fingerprint})"
        )
    if config.lr_scheduler != "constant" and manifest["schedule_steps"] != schedule_steps:
        raise ConfigError(
            f"checkpoint {directory} decays its {config.lr_scheduler} LR schedule over "
            f"{manifest['schedule_steps']} steps, this run over {schedule_steps}: resume with "
            "the checkpoint's max_steps and max_epochs"
        )
