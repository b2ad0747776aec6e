"""A LoRA actor in the trainer on two gloo ranks, with FSDP2 and with ZeRO-3: the reference is
the actor with its adapters disabled (a plain base model's logprobs), the base never changes,
the engine is sent only the adapted weights while it holds the rest, checkpoints hold no base,
and both exports load: the merged folder with transformers, the adapter folder with peft."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from lrft.api.digest import tensor_digests
from lrft.backends.train.lora import AdaptersDisabled
from lrft.run.export import LORA_ADAPTER_DIR
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.trainer.logprobs import plain_response_logprobs
from lrft.trainer.sequences import pack
from tests.trainer.test_trainer_ranks import _trainer

pytest.importorskip("peft", reason="peft is not installed: pip install 'lrft[lora]'")

LORA = ["--lora_rank=4", "--lora_alpha=8", "--init_kl_coef=0.05", "--actor_learning_rate=1e-2"]


def _digests(source: object, names: str = "full_weights") -> dict[str, str]:
    digests: dict[str, str] = {}
    for bucket in getattr(source, names)(1 << 20):
        digests.update(tensor_digests(dict(bucket)))
    return digests


def _lora_iteration(root: Path, extra: list[str]) -> dict[str, float]:
    trainer = _trainer(root, [*LORA, *extra])
    reference = trainer.colocation.reference
    assert isinstance(reference, AdaptersDisabled)
    assert not trainer.colocation.offload_reference
    base = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32)
    base_digests = tensor_digests(dict(base.named_parameters()))
    trainer.colocation.sync(version=0)
    metrics = trainer.train_step()
    # the frozen base is untouched; the merged weights moved
    assert _digests(reference) == base_digests
    merged = _digests(trainer.actor)
    assert merged.keys() == base_digests.keys()
    assert merged != base_digests
    # the reference policy is the base model itself, computed by the actor with adapters off
    results = trainer.maker.generate(trainer.train_data.select([0, 1]), trainer.maker.sampling)
    sequences = pack(results)
    got = trainer.maker.logprobs(reference, sequences)
    with torch.no_grad():
        want = plain_response_logprobs(
            base,
            sequences,
            temperature=trainer.maker.sampling.temperature,
            device=torch.device("cpu"),
        )
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    actor = trainer.maker.logprobs(trainer.actor, sequences)
    assert (actor - want).abs().max() > 1e-3, "the trained adapters change the actor's policy"
    # the engine holds the step's weights: a sync sends the adapted weights only
    report = trainer.colocation.sync(version=trainer.step + 1)
    out = {"kl": metrics["kl"], "unchanged": float(report.unchanged), "sent": float(report.tensors)}
    # checkpoints hold the adapters, not the base
    saved = _saved_parameter_names(trainer.save_checkpoint() / "model")
    assert saved, "the checkpoint holds no parameters"
    assert all(".lora_" in name for name in saved), sorted(saved)[:4]
    _exports_load(trainer.export, root / "out", merged)
    return out


def _saved_parameter_names(directory: Path) -> set[str]:
    """The model parameters a checkpoint holds: from DCP's metadata (fsdp2), or DeepSpeed's
    module states and ZeRO-3 parameter shapes."""
    names: set[str] = set()
    if (directory / ".metadata").is_file():
        from torch.distributed.checkpoint.filesystem import FileSystemReader

        keys = FileSystemReader(str(directory)).read_metadata().state_dict_metadata
        names |= {key.removeprefix("model.") for key in keys if key.startswith("model.")}
    for path in directory.rglob("*model_states.pt"):
        state = torch.load(path, map_location="cpu", weights_only=False)
        names |= set(state.get("module") or {})
        for shapes in state.get("param_shapes") or []:
            names |= set(shapes)
    return names


def _exports_load(export: object, out: Path, merged: dict[str, str]) -> None:
    assert callable(export)
    export(out / "hf_model")
    if current_rank_context().rank != 0:
        return
    from peft import PeftModel

    folder = AutoModelForCausalLM.from_pretrained(out / "hf_model", dtype=torch.float32)
    assert tensor_digests(dict(folder.named_parameters())) == merged
    base = AutoModelForCausalLM.from_pretrained(out.parent / "model", dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, out / LORA_ADAPTER_DIR)
    ids = torch.tensor([[5, 17, 42, 9, 100, 3]])
    with torch.no_grad():
        torch.testing.assert_close(
            adapted(input_ids=ids).logits, folder(input_ids=ids).logits, rtol=0, atol=1e-5
        )


class TestLoraTrainerRanks(DistributedSuite):
    world_size = 2

    @pytest.mark.parametrize("backend", [[], ["--zero_stage=3"]], ids=["fsdp2", "zero3"])
    def test_lora_actor_reference_sync_checkpoint_and_exports(
        self, pool: RankPool, tmp_path: Path, backend: list[str]
    ) -> None:
        if backend:
            pytest.importorskip("deepspeed", reason="deepspeed is not installed")
        root = pool.shared_dir / tmp_path.name
        results = pool.run(_lora_iteration, root, backend)
        for result in results:
            assert result["kl"] >= 0.0
            assert result["unchanged"] > 0, result
            assert result["sent"] > 0, result
