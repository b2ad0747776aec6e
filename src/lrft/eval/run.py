"""``lrft eval``: score a model folder or a checkpoint on a prompt set, on every rank.

The prompts are sharded over the ranks (:func:`lrft.data.eval_indices`: each scored once); each
rank generates greedily and, with ``n_samples``, samples ``n`` responses per prompt, through the
same engine, reward and formatting code as ``lrft train`` (the settings they share are a
:class:`~lrft.config.TrainConfig`'s). Rank 0 gathers every prompt's results, computes the
metrics of :mod:`lrft.eval.metrics` overall and by label, prints a table and writes the JSON
report. A checkpoint (a ``global_step<k>`` folder, or the folder holding them: its newest) is
loaded by the train backend it was written with and synced into the engine, exactly as the
trainer would serve it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist
from transformers import AutoTokenizer

from lrft.api.errors import ConfigError
from lrft.api.protocols import RolloutEngine, TrainBackend
from lrft.api.types import GenerationResult
from lrft.backends.registry import import_plugins
from lrft.backends.sync.direct import DirectSync
from lrft.config import TrainConfig
from lrft.config.problems import reporting
from lrft.data import PromptSample, eval_indices
from lrft.dist import RankInfo, all_gather_objects, init_distributed
from lrft.eval.metrics import PromptResult, by_label, summarize, table
from lrft.run import checkpoint as ckpt
from lrft.trainer.build import causal_lm
from lrft.trainer.components import train_backend
from lrft.trainer.experience import ExperienceMaker
from lrft.trainer.prompts import load_prompts
from lrft.trainer.rewards import build_reward, check_reward_settings, data_labels
from lrft.trainer.rollout_stack import rollout_stack

CHECKPOINT_BACKEND_SETTINGS = (
    "train_backend",
    "zero_stage",
    "deepspeed_config",
    "fsdp_cpu_offload",
    "fsdp_reshard_after_forward",
    "fsdp_defer_gradient_sync",
)
"""What of a checkpoint's own settings loading it takes: the backend that wrote its shards."""


@attrs.frozen(kw_only=True)
class EvalSettings:
    """What ``lrft eval`` does beyond the settings it shares with ``lrft train``.

    ``model``: a Hugging Face folder, an lrft checkpoint folder, or a folder of checkpoints
    (the newest is read). ``dataset`` / ``split``: the prompts. ``greedy``: score one greedy
    response per prompt. ``n_samples``: responses sampled per prompt at the shared
    ``temperature`` / ``top_p`` (0: none). ``ks``: the pass@k reported (those up to
    ``n_samples``). ``correct_above``: a response is correct when its reward exceeds it.
    ``output``: the JSON report's path (``None``: only the table is printed).
    """

    model: str
    dataset: str
    split: str | None = None
    greedy: bool = True
    n_samples: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    ks: tuple[int, ...] = (1,)
    correct_above: float = 0.0
    output: str | None = None

    def __attrs_post_init__(self) -> None:
        with reporting() as problems:  # every rule, reported together
            problems.check_each((self._check_work, self._check_ks))

    def _check_work(self) -> None:
        if not self.greedy and self.n_samples == 0:
            raise ConfigError("nothing to evaluate: --no-greedy needs --n_samples N > 0")

    def _check_ks(self) -> None:
        bad = [k for k in self.ks if k < 1 or (self.n_samples and k > self.n_samples)]
        if bad:
            raise ConfigError(
                f"pass_k {bad}: each k must be in [1, n_samples {self.n_samples}] (pass@k draws "
                "k of the n responses)"
            )
        if self.ks != (1,) and self.n_samples == 0:
            raise ConfigError("pass_k needs --n_samples N (pass@k is over sampled responses)")


@attrs.frozen(kw_only=True)
class ModelSource:
    """Where the weights come from: ``pretrain`` (a Hugging Face folder), and the checkpoint
    loaded over it when the model given was one."""

    pretrain: str
    checkpoint: Path | None
    saved: dict[str, Any] = attrs.field(factory=dict)

    def describe(self, model: str) -> str:
        """A line naming what is evaluated, given ``lrft eval --model model``."""
        if self.checkpoint is None:
            return f"evaluating the model folder {model}"
        chosen = (
            f"checkpoint {self.checkpoint}"
            if self.checkpoint == Path(model)
            else f"checkpoint {self.checkpoint} (the newest in {model})"
        )
        return f"evaluating {chosen}, over its base model {self.pretrain}"


def resolve_model(model: str) -> ModelSource:
    """A Hugging Face folder as it is; an lrft checkpoint (or the folder holding them: the
    newest) as its base model plus the checkpoint. Raises ``ConfigError`` for anything else."""
    path = Path(model)
    directory = path if (path / ckpt.MANIFEST).is_file() else ckpt.latest_checkpoint(path)
    if directory is not None:
        saved = ckpt.read_manifest(directory).get("config")
        if not isinstance(saved, dict) or not isinstance(saved.get("pretrain"), str):
            raise ConfigError(f"checkpoint {directory} records no base model (config.pretrain)")
        return ModelSource(pretrain=saved["pretrain"], checkpoint=directory, saved=saved)
    if (path / "config.json").is_file():
        return ModelSource(pretrain=model, checkpoint=None)
    raise ConfigError(
        f"model {model!r} is neither a Hugging Face folder (config.json) nor an lrft checkpoint "
        f"(global_step<k>/{ckpt.MANIFEST}) or a folder holding them"
    )


def shared_config(values: dict[str, Any], source: ModelSource) -> TrainConfig:
    """The settings ``lrft eval`` shares with ``lrft train`` as a :class:`TrainConfig`, with the
    model, and a checkpoint's train backend, filled in. Only the shared settings are read: the
    training-only ones keep their defaults and nothing reads them."""
    backend = {k: source.saved[k] for k in CHECKPOINT_BACKEND_SETTINGS if k in source.saved}
    return TrainConfig(**{**values, **backend, "pretrain": source.pretrain})


def run_eval(settings: EvalSettings, values: dict[str, Any]) -> dict[str, Any] | None:
    """Evaluate as :class:`EvalSettings` and ``values`` (``lrft train`` settings by name) say;
    collective. Returns the report on rank 0, ``None`` on the other ranks."""
    import_plugins(values.get("plugins", ()))
    source = resolve_model(settings.model)
    info = RankInfo.from_env()
    if info.rank == 0:
        print(source.describe(settings.model), flush=True)
    config = shared_config(
        {**values, "prompt_data": settings.dataset, "prompt_split": settings.split}, source
    )
    config.validate_inputs()
    check_reward_settings(config)
    init_distributed(info, timeout=timedelta(seconds=config.collective_timeout_s))
    tokenizer = AutoTokenizer.from_pretrained(source.pretrain)
    data = load_prompts(
        config, config.prompt_sources, tokenizer, limit=config.max_samples, split=settings.split
    )
    backend = train_backend(config, info)
    reward = build_reward(config, backend, data_labels([data]))
    stack = rollout_stack(
        config,
        info,
        pretrain=source.pretrain,
        reward=reward,
        tokenizer=tokenizer,
        device=backend.device,
        # the engine's batches hold micro_rollout_batch_size prompts of this many responses
        samples_per_prompt=max(settings.n_samples, 1),
    )
    engine, maker = stack.engine, stack.maker
    if source.checkpoint is not None:
        _load_checkpoint(config, backend, source.checkpoint, engine)
    decode = maker.decode
    prompts = data.select(eval_indices(len(data), rank=info.rank, world_size=info.world_size))
    chunks = math.ceil(math.ceil(len(data) / info.world_size) / config.micro_rollout_batch_size)
    mine = _evaluate(settings, maker, prompts, chunks, config, info.rank, decode)
    gathered = all_gather_objects(mine) if dist.get_world_size() > 1 else [mine]
    engine.shutdown()
    if info.rank != 0:
        return None
    results = sorted((r for part in gathered for r in part), key=lambda r: r.index)
    return _report(settings, source, results)


def _load_checkpoint(
    config: TrainConfig, backend: TrainBackend, directory: Path, engine: RolloutEngine
) -> None:
    """The checkpoint's actor, loaded by its train backend and synced into ``engine``."""
    actor = backend.prepare_trainable(
        causal_lm(config), optimizer=config.optimizer_config(config.actor_learning_rate)
    )
    actor.load(directory / ckpt.MODEL_DIR)
    DirectSync().sync(actor, engine, version=1)


def _evaluate(
    settings: EvalSettings,
    maker: ExperienceMaker,
    prompts: Sequence[PromptSample],
    chunks: int,
    config: TrainConfig,
    rank: int,
    decode: Callable[[Sequence[int]], str],
) -> list[PromptResult]:
    """This rank's prompts, in ``chunks`` rounds of ``micro_rollout_batch_size`` (every rank
    makes as many: generation and reward models may be collective); each result holds its
    responses as ``decode`` writes them."""
    size = config.micro_rollout_batch_size
    greedy = attrs.evolve(maker.sampling, n=1, temperature=0.0, seed=None)
    results: list[PromptResult] = []
    for chunk in range(chunks):
        part = list(prompts[chunk * size : (chunk + 1) * size])
        greedy_scored: list[tuple[float | None, str | None]] = [(None, None)] * len(part)
        if settings.greedy:
            outputs = maker.generate(part, greedy)
            texts = [decode(output.output_token_ids) for output in outputs]
            greedy_scored = list(zip(_scores(maker, part, outputs, 1), texts, strict=True))
        sampled: list[tuple[tuple[float, ...], tuple[str, ...]]] = [((), ())] * len(part)
        if settings.n_samples:
            n = settings.n_samples
            seed = (config.seed * 1_000_003 + chunk) * 4096 + rank
            outputs = maker.generate(part, attrs.evolve(maker.sampling, n=n, seed=seed))
            scores = _scores(maker, part, outputs, n)
            texts = [decode(output.output_token_ids) for output in outputs]
            sampled = [
                (tuple(scores[i * n : (i + 1) * n]), tuple(texts[i * n : (i + 1) * n]))
                for i in range(len(part))
            ]
        for prompt, (greedy_score, greedy_text), (sample_scores, sample_texts) in zip(
            part, greedy_scored, sampled, strict=True
        ):
            results.append(
                PromptResult(
                    index=prompt.source_index,
                    label="" if prompt.label is None else str(prompt.label),
                    greedy_score=greedy_score,
                    sample_scores=sample_scores,
                    prompt=prompt.prompt_text,
                    greedy_response=greedy_text,
                    sample_responses=sample_texts,
                )
            )
    return results


def _scores(
    maker: ExperienceMaker,
    prompts: Sequence[PromptSample],
    outputs: Sequence[GenerationResult],
    n: int,
) -> list[float]:
    scores, _ = maker.score(prompts, outputs, n)
    return [float(score) for score in scores.to(torch.float64)]


def _report(
    settings: EvalSettings, source: ModelSource, results: list[PromptResult]
) -> dict[str, Any]:
    overall = summarize(results, ks=settings.ks, threshold=settings.correct_above)
    labelled = {r.label for r in results} != {""}
    per_label = by_label(results, ks=settings.ks, threshold=settings.correct_above)
    report: dict[str, Any] = {
        "model": settings.model,
        "base_model": source.pretrain,
        "checkpoint": None if source.checkpoint is None else str(source.checkpoint),
        "dataset": settings.dataset,
        "split": settings.split,
        "n_samples": settings.n_samples,
        "correct_above": settings.correct_above,
        "metrics": overall,
        "per_label": per_label if labelled else {},
        "per_prompt": [r.as_json(settings.correct_above) for r in results],
    }
    print(table(overall, per_label if labelled else {}), flush=True)
    if settings.output is not None:
        path = Path(settings.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(json.dumps(report, indent=1))
        temporary.replace(path)
        print(f"report written to {path}", flush=True)
    return report
