"""``RLTrainer``: the colocated RL loop: GRPO-family estimators, and PPO with a critic (gae)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist

import lrft
from lrft.algo import AdaptiveKLController, KLController, RunningMoments
from lrft.api.errors import ConfigError
from lrft.api.protocols import FrozenModel, RolloutEngine, TrainableModel, WeightSync
from lrft.api.types import ModelPart
from lrft.config import TrainConfig
from lrft.data import DistributedPromptSampler, PromptDataset, eval_indices
from lrft.dist import PhaseWatch, mean_over_ranks, sum_over_ranks
from lrft.redaction import redact
from lrft.run import checkpoint as ckpt
from lrft.run.export import HF_MODEL_DIR
from lrft.run.metrics import CURVES_FILE, MetricsWriter, plot_curves
from lrft.run.outputs import TRAJECTORY_DIR, claim_outputs, own_outputs
from lrft.run.progress import Console
from lrft.run.resume import check_resume_settings, check_schedule, checkpoint_to_resume
from lrft.run.wandb_metrics import DEFAULT_PROJECT, WandbMetrics, WandbSettings
from lrft.trainer.colocation import Colocation
from lrft.trainer.critic import CriticUpdate, critic_values
from lrft.trainer.episodes import EpisodeBatch, EpisodeRollout, add_turns, with_returns
from lrft.trainer.experience import ExperienceMaker, pack_engine_logprobs, reward_means
from lrft.trainer.policy import PolicyUpdate, needs_old_logprob_pass
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.sampling import Refill, ScoredGroups, continuation_seed, refill_groups
from lrft.trainer.sequences import pack, row_media
from lrft.trainer.trajectories import TrajectoryWriter, sample_records
from lrft.trainer.trajectory_pages import group_pictures

logger = logging.getLogger(__name__)

EVAL_SLEEP_LEVEL = 1


@attrs.frozen(kw_only=True)
class FitResult:
    steps: int
    first_eval: dict[str, float] | None
    last_eval: dict[str, float] | None
    seconds: float


class RLTrainer:
    """Runs ``config``'s iterations on already-built components; see DESIGN.md.

    Construction does no collective work; :meth:`fit` is collective over the default group.
    ``export`` writes the Hugging Face folder (collective); ``None`` skips it. ``critic`` is
    required exactly when the estimator is value-based (``config.uses_critic``);
    ``critic_offload`` names the critic's parts kept on the host outside its phases, and
    ``offload_reference`` keeps the reference's parameters on the host outside its pass (only
    for a backend that declares parameter offload). ``watch`` is told every phase and step, so a
    collective timeout names them (default: a watch over the default group, started here).
    ``episodes`` rolls out multi-turn episodes instead of one response per sample
    (:mod:`lrft.trainer.episodes`), in training and evaluation alike.
    """

    def __init__(
        self,
        *,
        config: TrainConfig,
        actor: TrainableModel,
        reference: FrozenModel | None,
        engine: RolloutEngine,
        sync: WeightSync,
        maker: ExperienceMaker,
        train_data: PromptDataset,
        eval_data: PromptDataset | None,
        device: torch.device,
        export: Callable[[Path], None] | None = None,
        sleep_level: int | None = None,
        critic: TrainableModel | None = None,
        critic_offload: Collection[ModelPart] = (),
        offload_reference: bool = False,
        watch: PhaseWatch | None = None,
        episodes: EpisodeRollout | None = None,
    ) -> None:
        if (critic is not None) != config.uses_critic:
            raise ConfigError(
                f"advantage_estimator {config.advantage_estimator!r} "
                f"{'needs a' if config.uses_critic else 'trains no'} critic, but "
                f"{'none was' if critic is None else 'one was'} given"
            )
        self.config = config
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        config.validate_world(self.world_size)
        self.actor = actor
        self.critic = critic
        self.engine = engine
        self.maker = maker
        self.episodes = episodes
        self.train_data = train_data
        self.eval_data = eval_data
        self.device = device
        self.export = export
        if watch is None:
            watch = PhaseWatch.for_default_group(config.collective_timeout_s)
            watch.start()
        self.watch = watch
        self.colocation = Colocation(
            engine=engine,
            actor=actor,
            reference=reference,
            sync=sync,
            device=device,
            sleep_level=sleep_level,
            offload_reference=offload_reference,
            offload_optimizer=config.adam_offload,
            critic=critic,
            critic_offload=critic_offload,
            watch=watch,
        )
        self.sampler = DistributedPromptSampler(
            num_samples=len(train_data),
            global_batch_size=config.rollout_batch_size,
            rank=self.rank,
            world_size=self.world_size,
            seed=config.seed,
        )
        per_rank_train = config.train_batch_size // self.world_size
        self.update = PolicyUpdate.from_config(config, world_size=self.world_size)
        self.old_logprob_pass = needs_old_logprob_pass(config, actor.module)
        self.critic_update = CriticUpdate(
            micro_batch_size=config.micro_train_batch_size,
            accumulation=per_rank_train // config.micro_train_batch_size,
            epochs=config.max_epochs,
            value_clip=config.value_clip_range,
            max_tokens_per_micro_batch=config.max_tokens_per_micro_batch,
        )
        self.buffer = ReplayBuffer(seed=config.seed)
        self.kl_control = config.kl_controller()
        """The KL coefficient in force (adaptive with ``kl_target``), checkpointed."""
        self.metrics = MetricsWriter(
            Path(config.save_path),
            enabled=self.rank == 0,
            tensorboard=config.use_tensorboard,
            wandb=self._wandb() if config.use_wandb and self.rank == 0 else None,
        )
        self.console = Console(enabled=self.rank == 0, progress_bar=config.progress_bar)
        self.trajectories = (
            TrajectoryWriter(
                Path(config.save_path) / TRAJECTORY_DIR,
                every=config.save_trajectories_steps or 1,
                rank=self.rank,
            )
            if config.save_trajectories
            else None
        )
        self.step = 0
        self.run_id: str | None = None
        """The run's id (in ``run.json`` and every checkpoint's manifest), set by :meth:`fit`:
        a resumed run's is its checkpoint's."""

    def _wandb(self) -> WandbMetrics:
        settings = WandbSettings(
            directory=Path(self.config.save_path),
            project=self.config.wandb_project or DEFAULT_PROJECT,
            entity=self.config.wandb_org,
            group=self.config.wandb_group,
            name=self.config.wandb_run_name,
        )
        return WandbMetrics(settings, config=self.config.as_dict())

    @property
    def total_steps(self) -> int:
        return self.config.planned_iterations(self.sampler.batches_per_epoch)

    def _say(self, message: str) -> None:
        self.console.say(message)

    # --- one iteration ---------------------------------------------------------------------

    def rollout_seed(self, step: int, round_index: int = 0) -> int:
        """The sampling seed of ``step``'s rollout (its ``round_index``-th generate round under
        dynamic sampling), shared by the ranks of a TP group."""
        leader = self.rank - self.rank % self.config.engine_tp_size
        seed = (self.config.seed * 1_000_003 + step) * 4096 + leader
        return seed if round_index == 0 else continuation_seed(seed + round_index * (1 << 62))

    @property
    def data_exhausted(self) -> bool:
        """Whether ``num_episodes`` passes over the prompts were taken (dynamic sampling takes
        more than one batch in some iterations, so it may end before ``total_steps``)."""
        return self.sampler.epoch >= self.config.num_episodes

    def dynamic_rollout(self) -> Refill:
        """Generate-and-score rounds until the batch holds groups with a reward spread only
        (:func:`refill_groups`). Each round takes the sampler's next batch, so a checkpoint's
        sampler position counts every prompt consumed. Collective."""
        col, maker, n = self.colocation, self.maker, self.config.n_samples_per_prompt

        def roll_out(round_index: int) -> ScoredGroups:
            prompts = self.train_data.select(self.sampler.next_batch().indices)
            params = attrs.evolve(maker.sampling, seed=self.rollout_seed(self.step, round_index))
            # Level 1 at most: another round may follow, and level 2 would leave it stale weights.
            results = col.rollout(lambda: maker.generate(prompts, params), sleep_level=1)
            rewards = col.plain("rewards", lambda: maker.rate(prompts, results, n))
            lengths = torch.tensor([len(result.output_token_ids) for result in results])
            shaped = maker.shape(rewards.scores_tensor(), lengths)
            return ScoredGroups(prompts=prompts, results=results, rewards=rewards, shaped=shaped)

        return refill_groups(
            roll_out,
            max_rounds=self.config.generate_rounds,
            global_sum=lambda values: sum_over_ranks(values, self.device),
        )

    def train_step(self) -> dict[str, float]:
        """One iteration (DESIGN.md steps 1-11); returns rank-averaged metrics. Collective."""
        col, maker, n = self.colocation, self.maker, self.config.n_samples_per_prompt
        col.begin_iteration()
        self.watch.begin_step(self.step + 1)
        refill = None
        if self.config.dynamic_sampling:
            with self.watch.phase("dynamic_sampling"):
                refill = self.dynamic_rollout()
        episodes: EpisodeBatch | None = None
        if refill is None:
            prompts = self.train_data.select(self.sampler.next_batch().indices)
            params = attrs.evolve(maker.sampling, seed=self.rollout_seed(self.step))
            if self.episodes is None:
                results = col.rollout(lambda: maker.generate(prompts, params))
            else:
                rollout = self.episodes
                episodes = col.rollout(lambda: rollout.run(prompts, params))
                results = episodes.answers
        else:
            prompts, results = refill.batch.prompts, list(refill.batch.results)
        sequences = (
            pack(results, media=row_media(prompts, n)) if episodes is None else episodes.sequences
        )
        old = (
            col.actor_pass(lambda: maker.logprobs(self.actor, sequences))
            if self.old_logprob_pass
            else None
        )
        ref = col.reference_pass(lambda model: maker.logprobs(model, sequences))
        values = col.critic_pass(
            lambda model: critic_values(
                model, sequences, micro_batch_size=maker.micro_batch_size, device=self.device
            )
        )
        if refill is None:
            rewards = col.plain("rewards", lambda: maker.rate(prompts, results, n))
            shaped = maker.shape(rewards.scores_tensor(), sequences.action_mask.sum(-1))
        else:
            rewards, shaped = refill.batch.rewards, refill.batch.shaped
        token_rewards = None
        if episodes is not None:
            token_rewards = episodes.token_rewards(rewards.scores_tensor())
            rewards = with_returns(rewards, episodes)
            shaped = rewards.scores_tensor()
        engine = None
        if self.config.use_tis:
            engine = (
                pack_engine_logprobs(results, sequences.action_mask.shape[1])
                if episodes is None
                else episodes.engine_logprobs
            )
        experience = col.plain(
            "advantages",
            lambda: maker.make(
                sequences,
                shaped,
                old,
                ref,
                values=values,
                engine_logprobs=engine,
                token_rewards=token_rewards,
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
        if self.trajectories is not None and self.trajectories.due(self.step):
            records = sample_records(
                step=self.step,
                rank=self.rank,
                prompts=prompts,
                results=results if episodes is None else episodes.responses,
                rewards=rewards,
                experience=experience,
                decode=maker.decode,
                kl_estimator=maker.kl_estimator,
            )
            if episodes is not None:
                add_turns(records, episodes, maker.decode)
            with self.watch.phase("trajectories"):
                self.trajectories.write(self.step, records, group_pictures(prompts))
        lengths = sequences.action_mask.sum(-1).float()
        # Over every response generated: under dynamic sampling the trained batch is a filtered
        # subset, which would misreport how well the policy does.
        generated = rewards if refill is None else refill.generated
        scores = generated.scores_tensor()
        local = {
            "train/reward_mean": float(scores.mean()),
            "train/accuracy": float((scores > 0).float().mean()),
            "train/response_length": float(lengths.mean()),
            **reward_means(generated),
            **({} if episodes is None else episodes.metrics()),
            **({} if refill is None else refill.metrics),
            **self._shaping_metrics(rewards.scores_tensor(), shaped),
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
        rollout = self.episodes
        episodes = None
        if rollout is None:
            results = self.colocation.rollout(
                lambda: self.maker.generate(prompts, greedy),
                name="eval_generate",
                sleep_level=EVAL_SLEEP_LEVEL,
            )
        else:
            episodes = self.colocation.rollout(
                lambda: rollout.run(prompts, greedy),
                name="eval_generate",
                sleep_level=EVAL_SLEEP_LEVEL,
            )
            results = episodes.answers
        # Every rank scores, also one with no prompts: a sharded reward model's forward is
        # collective, and its ranks must call it alike.
        scores, _ = self.maker.score(prompts, results, 1)
        if episodes is not None:
            scores = scores + episodes.returns
        total, correct, count = sum_over_ranks(
            [float(scores.sum()), float((scores > 0).sum()), float(len(scores))], self.device
        )
        return {"eval/reward_mean": total / count, "eval/accuracy": correct / count}

    # --- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        manifest: dict[str, Any] = {
            "consumed_samples": self.sampler.total_consumed_samples,
            "sampler": self.sampler.state_dict(),
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
        if self.rank == 0 and self.metrics.path.exists():
            png = Path(self.config.save_path) / CURVES_FILE
            if plot_curves(self.metrics.path, png):
                self._say(f"curves written to {png}")
            else:
                self._say("matplotlib is not installed: no curve PNG (metrics are in JSONL)")
        if self.metrics.tensorboard is not None:
            self._say(f"TensorBoard logs in {self.metrics.tensorboard.log_dir}")
