"""``RLTrainer``: the RL loop over built parts: GRPO-family estimators, and PPO with a critic
(gae). Each iteration reads as its steps (docs/trainer.md, "One iteration")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch import Tensor

import lrft
from lrft.algo import AdaptiveKLController, KLController, RunningMoments
from lrft.api.errors import ConfigError, LrftError
from lrft.api.protocols import RolloutEngine, TrainableModel
from lrft.config import TrainConfig
from lrft.data import DistributedPromptSampler, PromptDataset, eval_indices
from lrft.dist import PhaseWatch, mean_over_ranks, sum_over_ranks
from lrft.redaction import redact
from lrft.run import checkpoint as ckpt
from lrft.run.export import HF_MODEL_DIR
from lrft.run.metrics import TRAIN_CURVES, report_outputs
from lrft.run.outputs import claim_outputs, own_outputs
from lrft.run.resume import check_resume_settings, check_schedule, checkpoint_to_resume
from lrft.trainer.colocation import Colocation
from lrft.trainer.critic import CriticUpdate, critic_values
from lrft.trainer.episodes import add_turns
from lrft.trainer.experience import ExperienceBatch, ExperienceMaker, reward_means
from lrft.trainer.policy import PolicyUpdate
from lrft.trainer.records import RunRecords
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.rollout import Rollout, RolloutBatch
from lrft.trainer.sequences import Sequences
from lrft.trainer.teacher import Teacher
from lrft.trainer.trajectories import sample_records
from lrft.trainer.trajectory_pages import group_pictures

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class FitResult:
    steps: int
    first_eval: dict[str, float] | None
    last_eval: dict[str, float] | None
    seconds: float


@attrs.frozen(kw_only=True, eq=False)
class TrainerParts:
    """Everything an :class:`RLTrainer` runs, built by :func:`lrft.trainer.build.build_trainer`.

    ``colocation`` owns the engine, the reference model, the weight sync and the phases;
    ``rollout`` makes each iteration's samples (:mod:`lrft.trainer.rollout`); ``maker`` turns
    them into experience; ``update`` and ``critic_update`` run the policy's and the critic's
    epochs over ``buffer``. ``critic`` is set exactly when the estimator is value-based.
    ``old_logprob_pass``: whether the policy loss needs the actor's own logprobs before the
    update (else its first epoch's are used). ``export`` writes the Hugging Face folder
    (collective; ``None`` skips it). ``watch`` is told every phase and step, so a collective
    timeout names them. ``records`` are the run's metrics, console and trajectories.
    """

    actor: TrainableModel
    critic: TrainableModel | None
    colocation: Colocation
    rollout: Rollout
    maker: ExperienceMaker
    sampler: DistributedPromptSampler
    train_data: PromptDataset
    eval_data: PromptDataset | None
    update: PolicyUpdate
    critic_update: CriticUpdate
    buffer: ReplayBuffer
    old_logprob_pass: bool
    records: RunRecords
    watch: PhaseWatch
    export: Callable[[Path], None] | None
    device: torch.device
    teacher: Teacher | None = None
    """The distillation teacher, scored in its own phase; ``None`` unless the estimator reads
    one."""


class RLTrainer:
    """Runs ``config``'s iterations on already-built parts (docs/trainer.md, "One iteration").

    Construction does no collective work; :meth:`fit` is collective over the default group.
    """

    def __init__(self, config: TrainConfig, parts: TrainerParts) -> None:
        if (parts.critic is not None) != config.uses_critic:
            raise ConfigError(
                f"advantage_estimator {config.advantage_estimator!r} "
                f"{'needs a' if config.uses_critic else 'trains no'} critic, but "
                f"{'none was' if parts.critic is None else 'one was'} given"
            )
        self.config = config
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        if config.placement == "colocated":  # split: checked for the whole job before start-up
            config.validate_world(self.world_size)
        self.parts = parts
        self.actor = parts.actor
        self.critic = parts.critic
        self.colocation = parts.colocation
        self.rollout = parts.rollout
        self.maker = parts.maker
        self.sampler = parts.sampler
        self.train_data = parts.train_data
        self.eval_data = parts.eval_data
        self.update = parts.update
        self.critic_update = parts.critic_update
        self.buffer = parts.buffer
        self.metrics = parts.records.metrics
        self.console = parts.records.console
        self.trajectories = parts.records.trajectories
        self.watch = parts.watch
        self.device = parts.device
        self.export = parts.export
        self.kl_control = config.kl_controller()
        """The KL coefficient in force (adaptive with ``kl_target``), checkpointed."""
        self.step = 0
        self.run_id: str | None = None
        """The run's id (in ``run.json`` and every checkpoint's manifest), set by :meth:`fit`:
        a resumed run's is its checkpoint's."""

    @property
    def engine(self) -> RolloutEngine:
        """This rank's engine; a trainer rank of a split placement holds none."""
        if self.colocation.engine is None:
            raise LrftError("this rank holds no engine: the rollout ranks generate")
        return self.colocation.engine

    @property
    def total_steps(self) -> int:
        return self.config.planned_iterations(self.sampler.batches_per_epoch)

    def _say(self, message: str) -> None:
        self.console.say(message)

    # --- one iteration ---------------------------------------------------------------------

    @property
    def data_exhausted(self) -> bool:
        """Whether ``num_episodes`` passes over the prompts were taken (dynamic sampling takes
        more than one batch in some iterations, so it may end before ``total_steps``)."""
        return self.sampler.epoch >= self.config.num_episodes

    def train_step(self) -> dict[str, float]:
        """One iteration (docs/trainer.md, "One iteration"); returns rank-averaged metrics.
        Collective."""
        col, maker = self.colocation, self.maker
        col.begin_iteration()
        self.watch.begin_step(self.step + 1)
        batch = self.rollout.collect(self.step)
        sequences = batch.sequences
        old = (
            col.actor_pass(lambda: maker.logprobs(self.actor, sequences))
            if self.parts.old_logprob_pass
            else None
        )
        ref = col.reference_pass(lambda model: maker.logprobs(model, sequences))
        taught = self._teacher_logprobs(sequences)
        values = col.critic_pass(
            lambda model: critic_values(
                model,
                sequences,
                micro_batch_size=maker.micro_batch_size,
                device=self.device,
                layout=maker.layout,
                max_tokens=maker.max_tokens_per_pass,
            )
        )
        experience = col.plain(
            "advantages",
            lambda: maker.make(
                sequences,
                batch.shaped,
                old,
                ref,
                values=values,
                engine_logprobs=batch.engine_logprobs,
                token_rewards=batch.token_rewards,
                weight_versions=batch.weight_versions,
                teacher_logprobs=taught,
            ),
        )
        self.buffer.clear()
        self.buffer.append(experience)
        policy_metrics = col.policy(
            lambda: self.update.run(self.actor, self.buffer, step=self.step, device=self.device)
        )
        critic_metrics = col.critic_update(
            lambda model: self.critic_update.run(
                model, self.buffer, step=self.step, device=self.device
            )
        )
        self.step += 1
        col.sync(version=self.step)
        self._record_trajectories(batch, experience)
        local = {
            **self._sample_metrics(batch),
            **experience.metrics,
            **policy_metrics,
            **(critic_metrics or {}),
            **col.records,
            **self._kl_coef_metric(),
        }
        with self.watch.phase("metrics"):
            metrics = mean_over_ranks(local)
        self._adapt_kl(metrics)
        return metrics

    def _teacher_logprobs(self, sequences: Sequences) -> Tensor | None:
        """The teacher's logprobs of the samples, in the ``teacher_logprobs`` phase; ``None``
        without a teacher."""
        teacher = self.parts.teacher
        if teacher is None:
            return None
        return self.colocation.teacher_pass(lambda: teacher.logprobs(sequences))

    def _sample_metrics(self, batch: RolloutBatch) -> dict[str, float]:
        # Over every response generated: under dynamic sampling the trained batch is a filtered
        # subset, which would misreport how well the policy does.
        scores = batch.generated.scores_tensor()
        lengths = batch.sequences.action_mask.sum(-1).float()
        return {
            "train/reward_mean": float(scores.mean()),
            "train/accuracy": float((scores > 0).float().mean()),
            "train/response_length": float(lengths.mean()),
            **reward_means(batch.generated),
            **batch.metrics,
            **self._shaping_metrics(batch.rewards.scores_tensor(), batch.shaped),
        }

    def _record_trajectories(self, batch: RolloutBatch, experience: ExperienceBatch) -> None:
        if self.trajectories is None or not self.trajectories.due(self.step):
            return
        records = sample_records(
            step=self.step,
            rank=self.rank,
            prompts=batch.prompts,
            results=batch.responses,
            rewards=batch.rewards,
            experience=experience,
            decode=self.maker.decode,
            kl_estimator=self.maker.kl_estimator,
            trained_version=self.step - 1,
        )
        if batch.episodes is not None:
            add_turns(records, batch.episodes, self.maker.decode)
        with self.watch.phase("trajectories"):
            self.trajectories.write(self.step, records, group_pictures(batch.prompts))

    def _kl_coef_metric(self) -> dict[str, float]:
        if self.config.kl_target is None:
            return {}
        return {"kl/coef": self.kl_control.value}

    def _adapt_kl(self, metrics: dict[str, float]) -> None:
        """The adaptive controller's update from this iteration's KL (the ranks' mean, so every
        rank moves the same way); the next iteration's rewards and loss use the new value."""
        if self.config.kl_target is None:
            return
        self._set_kl_coef(
            self.kl_control.update(metrics["kl"], n_steps=self.config.samples_per_rollout)
        )

    def _set_kl_coef(self, control: KLController) -> None:
        self.kl_control = control
        self.maker.kl_coef = control.value
        self.update = attrs.evolve(self.update, kl_coef=control.value)

    def _shaping_metrics(self, scores: torch.Tensor, shaped: torch.Tensor) -> dict[str, float]:
        if self.config.overlong_buffer_len is None:
            return {}
        return {"reward/overlong_penalty": float((shaped - scores).mean())}

    def evaluate(self) -> dict[str, float]:
        """Greedy held-out score. Touches no buffer, statistics, parameters or sampler."""
        if self.eval_data is None:
            return {}
        indices = eval_indices(len(self.eval_data), rank=self.rank, world_size=self.world_size)
        prompts = self.eval_data.select(indices)
        greedy = attrs.evolve(self.maker.sampling, n=1, temperature=0.0, seed=None)
        # Every rank scores, also one with no prompts: a sharded reward model's forward is
        # collective, and its ranks must call it alike.
        scores = self.rollout.eval_scores(prompts, greedy)
        total, correct, count = sum_over_ranks(
            [float(scores.sum()), float((scores > 0).sum()), float(len(scores))], self.device
        )
        return {"eval/reward_mean": total / count, "eval/accuracy": correct / count}

    # --- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        manifest: dict[str, Any] = {
            "consumed_samples": self.sampler.total_consumed_samples,
            # the prompt stream's position and the weights it continues from: a resumed run
            # (split placement too) generates the next batch with them, losing or repeating none
            "sampler": self.sampler.state_dict(),
            "weights_version": self.step,
            "config": redact(self.config.as_dict()),
            "lrft_version": lrft.__version__,
            "reward_moments": attrs.asdict(self.maker.reward_moments),
            "kl_coef": self.kl_control.value,
            "lr_schedule": attrs.asdict(self.config.scheduler_config(self.total_steps)),
            "data_fingerprint": self.train_data.fingerprint,
            "world_size": self.world_size,
            ckpt.RUN_ID: self.run_id,
            # A resumed job logs into the same W&B run, so its curves continue instead of
            # restarting in a new run.
            "wandb_run_id": None if self.metrics.wandb is None else self.metrics.wandb.run_id,
        }
        with self.watch.phase("checkpoint"), self.colocation.optimizer_resident():
            return ckpt.save_checkpoint(
                Path(self.config.checkpoint_dir),
                step=self.step,
                actor=self.actor,
                manifest=manifest,
                max_keep=self.config.max_ckpt_num,
                critic=self.critic,
            )

    def resume(self) -> bool:
        """Load the latest complete checkpoint, if any; ``True`` when one was loaded."""
        latest = checkpoint_to_resume(self.config)
        if latest is None:
            self._say(f"no checkpoint under {self.config.checkpoint_dir}: starting from step 0")
            return False
        changed = check_resume_settings(ckpt.read_manifest(latest), self.config, latest)
        if changed:
            self._say(f"resuming with changed settings: {'; '.join(changed)}")
        with self.colocation.optimizer_resident():
            manifest = ckpt.load_checkpoint(latest, self.actor, self.critic)
        if manifest["data_fingerprint"] != self.train_data.fingerprint:
            raise ConfigError(
                f"checkpoint {latest} was written for other prompts (data fingerprint "
                f"{manifest['data_fingerprint']} != {self.train_data.fingerprint})"
            )
        now = attrs.asdict(self.config.scheduler_config(self.total_steps))
        check_schedule(manifest.get("lr_schedule"), now, latest)
        self.sampler.load_state_dict(manifest["sampler"])
        self.maker.reward_moments = RunningMoments(**manifest["reward_moments"])
        if isinstance(self.kl_control, AdaptiveKLController):
            self._set_kl_coef(attrs.evolve(self.kl_control, value=float(manifest["kl_coef"])))
        self.step = int(manifest["step"])
        saved_run = manifest.get(ckpt.RUN_ID)
        self.run_id = None if saved_run is None else str(saved_run)
        self.metrics.resume_at(self.step)
        run_id = manifest.get("wandb_run_id")
        if run_id is not None and self.metrics.wandb is not None:
            self.metrics.wandb.continue_run(str(run_id))
        self._say(f"resumed from {latest} at step {self.step}")
        return True

    # --- the loop ----------------------------------------------------------------------------

    def fit(self) -> FitResult:
        """All iterations, evaluations, checkpoints and the export. Collective."""
        try:
            with self.watch.phase("fit"):
                result = self._fit()
        except BaseException:
            # The TensorBoard event file stays complete up to the last record, and W&B marks
            # the run failed instead of leaving it "running".
            self.console.close()
            self.metrics.close(failed=True)
            self.watch.close(failed=True)
            raise
        self.console.close()
        self.metrics.close()
        self.watch.close()
        return result

    def _fit(self) -> FitResult:
        start = time.perf_counter()
        removed = claim_outputs(self.config, rank=self.rank)
        if removed is not None:
            self._say(removed)
        if self.config.load_checkpoint:
            self.resume()
        self.run_id = own_outputs(Path(self.config.save_path), self.run_id, rank=self.rank)
        if self.metrics.wandb is not None:
            self.metrics.wandb.start()  # after resume: it may continue the checkpoint's run
        if self.trajectories is not None:
            self.trajectories.discard_after(self.step)
        self.rollout.begin(self.step)
        self.colocation.sync(version=self.step)
        first: dict[str, float] | None = None
        last: dict[str, float] | None = None
        if self.step == 0 and self.eval_data is not None:
            first = last = self._evaluate_and_log()
        total = self.total_steps
        self.console.start(total=total, initial=self.step)
        while self.step < total and not self.data_exhausted:
            began = time.perf_counter()
            metrics = self.train_step()
            metrics["time/step_s"] = time.perf_counter() - began
            self.metrics.log(self.step, "train", metrics)
            self.console.step(self.step, total, metrics, time.perf_counter() - start)
            every = self.config.eval_steps
            finished = self.step == total or self.data_exhausted
            if self.eval_data is not None and ((every > 0 and self.step % every == 0) or finished):
                last = self._evaluate_and_log()
                first = first if first is not None else last
            if self.config.save_steps > 0 and self.step % self.config.save_steps == 0:
                path = self.save_checkpoint()
                self._say(f"checkpoint {path}")
        self.console.close()  # what follows prints below the finished bar
        self._finish()
        return FitResult(
            steps=self.step, first_eval=first, last_eval=last, seconds=time.perf_counter() - start
        )

    def _evaluate_and_log(self) -> dict[str, float]:
        with self.watch.phase("eval"):
            values = self.evaluate()
        self.metrics.log(self.step, "eval", values)
        self._say(
            f"eval at step {self.step}: accuracy {values['eval/accuracy']:.3f}  "
            f"reward {values['eval/reward_mean']:.3f}"
        )
        return values

    def _finish(self) -> None:
        if self.export is not None:
            target = Path(self.config.save_path) / HF_MODEL_DIR
            with self.watch.phase("export"):
                self.export(target)
            self._say(f"Hugging Face model written to {target}")
        report_outputs(self.metrics, Path(self.config.save_path), TRAIN_CURVES, self._say)
