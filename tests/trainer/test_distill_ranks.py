"""On-policy distillation and process rewards in the trainer on two gloo ranks, with FSDP2 and
with ZeRO-3: the teacher and the process reward model are resident only during their own
phases, the teacher's logprobs are a plain transformers forward's, the advantages are GRPO's of
the outcome plus the process reward model's step scores (a plain forward of each row alone at
its steps' ends) plus ``-coef * clamp(student - teacher)``, computed by hand from the batch; a
teacher service returns what the in-process teacher computes, a run resumed from a checkpoint
trains to the same weights as one that went straight on, and pure distillation from a service
runs with no reward at all."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from lrft.api.digest import tensor_digests
from lrft.api.types import Location
from lrft.cli import config_from_args
from lrft.testing.distributed import DistributedSuite, RankPool
from lrft.trainer.build import build_trainer
from lrft.trainer.logprobs import plain_response_logprobs
from lrft.trainer.teacher import ModelTeacher, ServiceTeacher
from lrft.trainer.trainer import RLTrainer
from tests.trainer.fixtures import (
    REWARD_FLAG,
    base_args,
    make_model_folder,
    make_prompt_files,
    rank_info,
)
from tests.trainer.test_trainer_ranks import _trainer
from tests.unit.rm.models import save_with_tokenizer, tiny_token_classifier

COEF = 0.5
SEPARATOR = "3"
HYBRID = [
    "--advantage_estimator=on_policy_distillation_hybrid",
    f"--opd_kl_coef={COEF}",
    "--enable_engine_sleep",
    # a reference beside the teacher (LightRFT's example keeps a KL loss); in the loss, so the
    # rewards the advantages see are the task's alone
    "--init_kl_coef=0.01",
    "--use_kl_loss",
]


def write_inputs(root: Path) -> None:
    """The student, a teacher of its tokenizer (other weights) and the prompts; called by the
    test before the ranks start, so that a teacher service can load the same teacher."""
    if not (root / "teacher").exists():
        make_model_folder(root / "model")
        make_model_folder(root / "teacher", seed=5)
        save_with_tokenizer(tiny_token_classifier(seed=9), root / "prm")
        make_prompt_files(root / "data")


def _digests(trainer: RLTrainer) -> dict[str, str]:
    digests: dict[str, str] = {}
    for bucket in trainer.actor.full_weights(1 << 20):
        digests.update(tensor_digests(dict(bucket)))
    return digests


def _grpo(scores: list[float], n: int) -> list[float]:
    """GRPO's advantage by hand: (s - mean) / (Bessel std + 1e-6) within each group of n."""
    out = []
    for start in range(0, len(scores), n):
        group = scores[start : start + n]
        mean, std = statistics.fmean(group), statistics.stdev(group)
        out += [0.0 if std == 0 else (s - mean) / (std + 1e-6) for s in group]
    return out


class _Recorded:
    """The trainer's teacher, recording what it is asked and answers (``sequences``,
    ``logprobs``) and where the model's parameters are at each of its forwards."""

    def __init__(self, teacher: ModelTeacher) -> None:
        self.teacher = teacher
        self.resident: list[Location] = []
        self.sequences: Any = None
        self.answer = torch.zeros(0)
        teacher.model.module.register_forward_pre_hook(
            lambda *_: self.resident.append(teacher.model.placement.parameters)
        )

    def logprobs(self, sequences: Any) -> torch.Tensor:
        self.sequences, self.answer = sequences, self.teacher.logprobs(sequences)
        return self.answer


def _step_scores(root: Path, sequences: Any) -> torch.Tensor:
    """(B,): the sum of each row's step scores, by a plain transformers forward of the process
    reward model over the row alone, read at its steps' ends."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from lrft.rewards.process import step_ends

    model = AutoModelForTokenClassification.from_pretrained(root / "prm", dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(root / "prm")
    sums = []
    for row in range(len(sequences)):
        length = int(sequences.action_mask[row].sum())
        response = sequences.action_tokens[row, :length].tolist()
        ends = step_ends(
            response,
            SEPARATOR,
            lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=False)),
            set(tokenizer.all_special_ids),
        )
        start = int(sequences.prompt_lengths[row])
        ids = sequences.input_ids[row, : start + length][None]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :, 0]
        sums.append(float(torch.sigmoid(logits[[start + end for end in ends]]).sum()))
    return torch.tensor(sums)


def _plain_teacher(root: Path, sequences: Any) -> torch.Tensor:
    """The teacher's logprobs of ``sequences`` by a plain transformers forward."""
    with torch.no_grad():
        return plain_response_logprobs(
            AutoModelForCausalLM.from_pretrained(root / "teacher", dtype=torch.float32),
            sequences,
            temperature=1.0,
            device=torch.device("cpu"),
        )


def checked_experience(
    root: Path, trainer: RLTrainer, seen: _Recorded, *, coef: float, hybrid: bool, process: bool
) -> dict[str, Any]:
    """How far the trainer's last experience is from the hand computation: the advantages
    (``hybrid``: GRPO of the outcome, plus with ``process`` the process reward model's step
    scores by a plain forward; then ``-coef * clamp(student - teacher)``) and the teacher's
    logprobs (a plain forward's)."""
    sequences, taught = seen.sequences, seen.answer
    rows = torch.arange(len(sequences))  # in order
    group = trainer.maker.layout.group
    if group is not None:  # a sequence-parallel group's buffer holds its ranks' rows in order
        rows += dist.get_rank(group) * len(sequences)
    experience = trainer.buffer.select(rows)
    old, mask = experience.old_logprobs, experience.sequences.action_mask
    assert old is not None
    # the group's rows are as wide as its widest: the teacher's, of this rank's, padded
    taught = torch.nn.functional.pad(taught, (0, mask.shape[1] - taught.shape[1]))
    expected = -coef * (old - taught).clamp(-20, 20)
    if hybrid:
        # the outcome on the last token, the step scores at the steps' ends: GRPO compares
        # the sums
        totals = experience.scores + (_step_scores(root, sequences) if process else 0.0)
        grpo = torch.tensor(_grpo(totals.tolist(), 4))[:, None]
        assert grpo.abs().max() > 0.1  # the task reward (digit_fraction) varies within groups
        expected = expected + grpo
    return {
        "advantage_error": float(
            (experience.advantages - expected.masked_fill(~mask, 0)).abs().max()
        ),
        "plain_error": float((seen.answer - _plain_teacher(root, sequences)).abs().max()),
        "scores": experience.scores.tolist(),
    }


def process_model(trainer: RLTrainer) -> Any:
    """The trainer's process rewards: the colocated rollout's, or the split trainer's."""
    rollout: Any = trainer.rollout
    return rollout.process if hasattr(rollout, "process") else rollout.parts.process


def recorded_teacher(trainer: RLTrainer) -> _Recorded:
    """The trainer's teacher, replaced by one that records what it is asked and answers."""
    teacher = trainer.parts.teacher
    assert isinstance(teacher, ModelTeacher)
    seen = _Recorded(teacher)
    object.__setattr__(trainer.parts, "teacher", seen)  # the parts are frozen: a test's detour
    return seen


def hybrid_iteration(root: Path, backend: list[str], url: str) -> dict[str, Any]:
    teacher_flag = f"--teacher_pretrain={root / 'teacher'}"
    process = [f"--prm_pretrain={root / 'prm'}", f"--prm_step_separator={SEPARATOR}"]
    trainer = _trainer(root, [*HYBRID, teacher_flag, *process, *backend])
    prm = process_model(trainer)
    prm_resident: list[Location] = []
    prm.model.module.register_forward_pre_hook(
        lambda *_: prm_resident.append(prm.model.placement.parameters)
    )
    assert trainer.parts.old_logprob_pass  # the advantage reads the student's logprobs
    seen = recorded_teacher(trainer)
    placed_before = seen.teacher.model.placement.parameters
    trainer.colocation.sync(version=0)
    metrics = trainer.train_step()
    checked = checked_experience(root, trainer, seen, coef=COEF, hybrid=True, process=True)
    # the same sequences through a teacher service that scores with the same model
    from lrft.distill.remote import RemoteTeacher

    with RemoteTeacher(url=url, trust_env=False) as remote:
        served = ServiceTeacher(service=remote, temperature=1.0).logprobs(seen.sequences)
    served_error = float((seen.answer - served).abs().max())
    checkpoint = trainer.save_checkpoint()
    trainer.colocation.sync(version=trainer.step)
    trainer.train_step()
    straight = _digests(trainer)
    resumed = _trainer(root, [*HYBRID, teacher_flag, *process, "--load_checkpoint", *backend])
    assert resumed.resume()
    resumed.colocation.begin_iteration()
    resumed.colocation.sync(version=resumed.step)
    resumed.train_step()
    return {
        "order": list(resumed.colocation.order),
        "placed": [placed_before, seen.teacher.model.placement.parameters],
        "resident": sorted(set(seen.resident), key=str),
        "prm_resident": sorted(set(prm_resident), key=str),
        "prm_after": prm.model.placement.parameters,
        "steps": metrics["process/steps"],
        "advantage_error": checked["advantage_error"],
        "plain_error": checked["plain_error"],
        "served_error": served_error,
        "metrics": {k: metrics[k] for k in ("distill/reverse_kl", "distill/teacher_logprob")},
        "checkpoint": checkpoint.name,
        "resume_equal": _digests(resumed) == straight,
    }


def _unrewarded_trainer(root: Path, extra: list[str]) -> RLTrainer:
    """A trainer of ``base_args`` without their reward and held-out prompts (and the reward's
    reference column)."""
    data = root / "data"
    args = base_args(root / "model", data / "train.jsonl", data / "eval.jsonl", root / "served")
    dropped = (REWARD_FLAG, "--eval_dataset=", "--reference_key=")
    kept = [arg for arg in args if not arg.startswith(dropped)]
    return build_trainer(config_from_args([*kept, *extra]), rank_info())


def served_iteration(root: Path, url: str) -> dict[str, Any]:
    """Pure distillation from the command line's teacher service, with no task reward and no
    reward given: nothing scores the samples."""
    os.environ["LRFT_TEST_TEACHER_TOKEN"] = "teacher-token"
    flags = [
        "--advantage_estimator=on_policy_distillation",
        f"--teacher_url={url}",
        "--teacher_auth_env=LRFT_TEST_TEACHER_TOKEN",
        "--teacher_timeout_s=20",
        "--no_task_reward",
    ]
    trainer = _unrewarded_trainer(root, flags)
    assert trainer.maker.reward is None
    teacher = trainer.parts.teacher
    assert isinstance(teacher, ServiceTeacher)
    trainer.colocation.sync(version=0)
    metrics = trainer.train_step()
    experience = trainer.buffer.select(torch.arange(len(trainer.buffer)))
    old, mask = experience.old_logprobs, experience.sequences.action_mask
    assert old is not None
    served = teacher.logprobs(experience.sequences)  # the same rows, asked again
    expected = (-1.0 * (old - served).clamp(-20, 20)).masked_fill(~mask, 0.0)
    return {
        "timeout": teacher.service.timeout_s,
        "scores": experience.scores.tolist(),
        "advantage_error": float((experience.advantages - expected).abs().max()),
        "order": list(trainer.colocation.order),
        "reverse_kl": metrics["distill/reverse_kl"],
    }


def teacher_service(folder: Path) -> Any:
    """A teacher service in lrft's format that scores with the model in ``folder``."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.train(False)

    def answer(_: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        rows = []
        for sequence in body["sequences"]:
            ids = torch.tensor([sequence["token_ids"]])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].double() / body["temperature"]
            logprobs = torch.log_softmax(logits, dim=-1)
            start = sequence["response_start"]
            rows.append([float(logprobs[k - 1, ids[0, k]]) for k in range(start, ids.shape[1])])
        return 200, {"logprobs": rows}

    return answer


class TestDistillationRanks(DistributedSuite):
    world_size = 2

    @pytest.mark.parametrize("backend", [[], ["--zero_stage=3"]], ids=["fsdp2", "zero3"])
    def test_teacher_phase_advantages_service_and_resume(
        self, pool: RankPool, tmp_path: Path, backend: list[str]
    ) -> None:
        if backend:
            pytest.importorskip("deepspeed", reason="deepspeed is not installed")
        from tests.unit.rewards.test_remote import ScriptedServer

        root = pool.shared_dir / tmp_path.name
        write_inputs(root)
        server = ScriptedServer(teacher_service(root / "teacher"))
        try:
            results = pool.run(hybrid_iteration, root, backend, server.url)
        finally:
            server.close()
        for result in results:
            order = result["order"]
            assert order.index("rewards") < order.index("process_rewards")
            assert order.index("process_rewards") < order.index("actor_logprobs")
            assert order.index("reference_logprobs") < order.index("teacher_logprobs")
            assert order.index("teacher_logprobs") < order.index("advantages")
            # slept like the reference: on the host but during its own forward
            assert result["placed"] == [Location.HOST, Location.HOST]
            assert result["resident"] == [Location.DEVICE]
            assert result["prm_resident"] == [Location.DEVICE]
            assert result["prm_after"] == Location.HOST
            assert result["steps"] >= 1.0
            assert result["plain_error"] < 2e-5
            assert result["served_error"] < 2e-5
            assert result["advantage_error"] < 1e-5
            assert math.isfinite(result["metrics"]["distill/reverse_kl"])
            assert result["metrics"]["distill/teacher_logprob"] < 0
            assert result["checkpoint"] == "global_step1"
            assert result["resume_equal"]

    def test_a_teacher_service_from_the_command_line_without_a_task_reward(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        from tests.unit.rewards.test_remote import ScriptedServer

        root = pool.shared_dir / tmp_path.name
        write_inputs(root)
        server = ScriptedServer(teacher_service(root / "teacher"))
        try:
            results = pool.run(served_iteration, root, server.url)
        finally:
            server.close()
        for result in results:
            assert result["timeout"] == 20.0
            assert result["scores"] == [0.0] * 8  # no task reward: every sample scores 0
            assert result["advantage_error"] < 1e-5
            assert "teacher_logprobs" in result["order"]
            assert result["reverse_kl"] != 0.0
        # each rank's batch in one POST per call (the step's, then the test's own)
        assert len(server.requests) == 4
        assert {h["authorization"] for h in server.headers} == {"Bearer teacher-token"}
