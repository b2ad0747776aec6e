"""``RLTrainer``: the colocated RL loop for GRPO-family estimators (no critic)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist

import lrft
from lrft.algo import PolicyLossConfig, RunningMoments
from lrft.api.errors import ConfigError
from lrft.api.protocols import FrozenModel, RolloutEngine, TrainableModel, WeightSync
from lrft.data import DistributedPromptSampler, PromptDataset, eval_indices
from lrft.dist import all_gather_objects
from lrft.trainer import checkpoint as ckpt
from lrft.trainer.colocation import Colocation
from lrft.trainer.config import TrainConfig
from lrft.trainer.experience import ExperienceMaker, pack
from lrft.trainer.metrics import MetricsWriter, plot_curves
from lrft.trainer.policy import PolicyUpdate
from lrft.trainer.replay import ReplayBuffer

logger = logging.getLogger(__name__)

EVAL_SLEEP_LEVEL = 1


@attrs.frozen(kw_only=True)
class FitResult:
    steps: int
    first_eval: dict[str, float] | None
    last_eval: dict[str, float] | None
    seconds: float


def mean_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Each metric averaged over the ranks that report it (same keys on every rank expected)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return dict(values)
    gathered = all_gather_objects(values)
    keys = sorted({key for part in gathered for key in part})
    return {
        key: sum(p[key] for p in gathered if key in p) / sum(1 for p in gathered if key in p)
        for key in keys
    }


def sum_over_ranks(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sums over every rank; ``device`` is this rank's (NCCL reduces device tensors
    only, gloo host tensors)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor)
    return [float(x) for x in tensor.tolist()]


class RLTrainer:
    """Runs ``config``'s iterations on already-built components; see DESIGN.md.

    Construction does no collective work; :meth:`fit` is collective over the default group.
    ``export`` writes the Hugging Face folder (collective); ``None`` skips it.
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
    ) -> None:
        self.config = config
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        config.validate_world(self.world_size)
        self.actor = actor
        self.engine = engine
        self.maker = maker
        self.train_data = train_data
        self.eval_data = eval_data
        self.device = device
        self.export = export
        self.colocation = Colocation(
            engine=engine,
            actor=actor,
            reference=reference,
            sync=sync,
            device=device,
            sleep_level=sleep_level,
            offload_reference=config.enable_engine_sleep and reference is not None,
            offload_optimizer=config.adam_offload,
        )
        self.sampler = DistributedPromptSampler(
            num_samples=len(train_data),
            global_batch_size=config.rollout_batch_size,
            rank=self.rank,
            world_size=self.world_size,
            seed=config.seed,
        )
        per_rank_train = config.train_batch_size // self.world_size
        self.update = PolicyUpdate(
            micro_batch_size=config.micro_train_batch_size,
            accumulation=per_rank_train // config.micro_train_batch_size,
            epochs=config.max_epochs,
            temperature=config.temperature,
            kl_coef=config.init_kl_coef,
            kl_estimator=config.kl_estimator,
            use_kl_loss=config.use_kl_loss,
            loss=PolicyLossConfig(eps_clip=config.eps_clip),
        )
        self.buffer = ReplayBuffer(seed=config.seed)
        self.metrics = MetricsWriter(
            Path(config.save_path), enabled=self.rank == 0, tensorboard=config.use_tensorboard
        )
        self.step = 0

    @property
    def total_steps(self) -> int:
        steps = self.config.num_episodes * self.sampler.batches_per_epoch
        return steps if self.config.max_steps is None else min(steps, self.config.max_steps)

    def _say(self, message: str) -> None:
        if self.rank == 0:
            print(message, flush=True)

    # --- one iteration ---------------------------------------------------------------------

    def rollout_seed(self, step: int) -> int:
        leader = self.rank - self.rank % self.config.engine_tp_size
        return (self.config.seed * 1_000_003 + step) * 4096 + leader

    def train_step(self) -> dict[str, float]:
        """One iteration (DESIGN.md steps 1-11); returns rank-averaged metrics. Collective."""
        col, maker, n = self.colocation, self.maker, self.config.n_samples_per_prompt
        col.begin_iteration()
        prompts = self.train_data.select(self.sampler.next_batch().indices)
        params = attrs.evolve(maker.sampling, seed=self.rollout_seed(self.step))
        results = col.rollout(lambda: maker.generate(prompts, params))
        sequences = pack(results)
        old = col.actor_pass(lambda: maker.logprobs(self.actor, sequences))
        ref = col.reference_pass(lambda model: maker.logprobs(model, sequences))
        scores, reward_metrics = col.plain("rewards", lambda: maker.score(prompts, results, n))
        experience = col.plain("advantages", lambda: maker.make(sequences, scores, old, ref))
        self.buffer.clear()
        self.buffer.append(experience)
        policy_metrics = col.policy(
            lambda: self.update.run(self.actor, self.buffer, step=self.step, device=self.device)
        )
        self.step += 1
        col.sync(version=self.step)
        lengths = sequences.action_mask.sum(-1).float()
        local = {
            "train/reward_mean": float(scores.mean()),
            "train/accuracy": float((scores > 0).float().mean()),
            "train/response_length": float(lengths.mean()),
            **reward_metrics,
            **experience.metrics,
            **policy_metrics,
            **col.records,
        }
        return mean_over_ranks(local)

    def evaluate(self) -> dict[str, float]:
        """Greedy held-out score. Touches no buffer, statistics, parameters or sampler."""
        if self.eval_data is None:
            return {}
        indices = eval_indices(len(self.eval_data), rank=self.rank, world_size=self.world_size)
        prompts = self.eval_data.select(indices)
        greedy = attrs.evolve(self.maker.sampling, n=1, temperature=0.0, seed=None)
        results = self.colocation.rollout(
            lambda: self.maker.generate(prompts, greedy),
            name="eval_generate",
            sleep_level=EVAL_SLEEP_LEVEL,
        )
        if prompts:
            scores, _ = self.maker.score(prompts, results, 1)
        else:
            scores = torch.zeros(0)
        total, correct, count = sum_over_ranks(
            [float(scores.sum()), float((scores > 0).sum()), float(len(scores))], self.device
        )
        return {"eval/reward_mean": total / count, "eval/accuracy": correct / count}

    # --- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        manifest: dict[str, Any] = {
            "consumed_samples": self.sampler.total_consumed_samples,
            "sampler": self.sampler.state_dict(),
            "config": self.config.as_dict(),
            "lrft_version": lrft.__version__,
            "reward_moments": attrs.asdict(self.maker.reward_moments),
            "data_fingerprint": self.train_data.fingerprint,
            "world_size": self.world_size,
        }
        with self.colocation.optimizer_resident():
            return ckpt.save_checkpoint(
                Path(self.config.checkpoint_dir),
                step=self.step,
                actor=self.actor,
                manifest=manifest,
                max_keep=self.config.max_ckpt_num,
            )

    def resume(self) -> bool:
        """Load the latest complete checkpoint, if any; ``True`` when one was loaded."""
        latest = ckpt.latest_checkpoint(Path(self.config.checkpoint_dir))
        if latest is None:
            self._say(f"no checkpoint under {self.config.checkpoint_dir}: starting from step 0")
            return False
        with self.colocation.optimizer_resident():
            manifest = ckpt.load_checkpoint(latest, self.actor)
        if manifest["data_fingerprint"] != self.train_data.fingerprint:
            raise ConfigError(
                f"checkpoint {latest} was written for other prompts (data fingerprint "
                f"{manifest['data_fingerprint']} != {self.train_data.fingerprint})"
            )
        self.sampler.load_state_dict(manifest["sampler"])
        self.maker.reward_moments = RunningMoments(**manifest["reward_moments"])
        self.step = int(manifest["step"])
        self._say(f"resumed from {latest} at step {self.step}")
        return True

    # --- the loop ----------------------------------------------------------------------------

    def fit(self) -> FitResult:
        """All iterations, evaluations, checkpoints and the export. Collective."""
        try:
            return self._fit()
        finally:
            # Also on failure: the TensorBoard event file is complete up to the last record.
            self.metrics.close()

    def _fit(self) -> FitResult:
        start = time.perf_counter()
        if self.config.load_checkpoint:
            self.resume()
        self.colocation.sync(version=self.step)
        first: dict[str, float] | None = None
        last: dict[str, float] | None = None
        if self.step == 0 and self.eval_data is not None:
            first = last = self._evaluate_and_log()
        total = self.total_steps
        while self.step < total:
            began = time.perf_counter()
            metrics = self.train_step()
            metrics["time/step_s"] = time.perf_counter() - began
            self.metrics.log(self.step, "train", metrics)
            self._say(
                f"step {self.step}/{total}  reward {metrics['train/reward_mean']:.3f}  "
                f"length {metrics['train/response_length']:.1f}  "
                f"{metrics['time/step_s']:.1f}s  elapsed {time.perf_counter() - start:.0f}s"
            )
            every = self.config.eval_steps
            if self.eval_data is not None and (
                (every > 0 and self.step % every == 0) or self.step == total
            ):
                last = self._evaluate_and_log()
                first = first if first is not None else last
            if self.config.save_steps > 0 and self.step % self.config.save_steps == 0:
                path = self.save_checkpoint()
                self._say(f"checkpoint {path}")
        self._finish()
        return FitResult(
            steps=self.step, first_eval=first, last_eval=last, seconds=time.perf_counter() - start
        )

    def _evaluate_and_log(self) -> dict[str, float]:
        values = self.evaluate()
        self.metrics.log(self.step, "eval", values)
        self._say(
            f"eval at step {self.step}: accuracy {values['eval/accuracy']:.3f}  "
            f"reward {values['eval/reward_mean']:.3f}"
        )
        return values

    def _finish(self) -> None:
        if self.export is not None:
            target = Path(self.config.save_path) / "hf_model"
            self.export(target)
            self._say(f"Hugging Face model written to {target}")
        if self.rank == 0 and self.metrics.path.exists():
            png = Path(self.config.save_path) / "curves.png"
            if plot_curves(self.metrics.path, png):
                self._say(f"curves written to {png}")
            else:
                self._say("matplotlib is not installed: no curve PNG (metrics are in JSONL)")
        if self.metrics.tensorboard is not None:
            self._say(f"TensorBoard logs in {self.metrics.tensorboard.log_dir}")
