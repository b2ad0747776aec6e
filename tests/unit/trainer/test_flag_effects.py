"""No dead flags, by their effect: every ``lrft train`` flag, given a value other than its
default, changes what a short run does (:mod:`tests.unit.trainer.flag_probe` records it: the
engine's calls, the metrics, the files, the weights, what was printed and what was built).

Each entry of :data:`CASES` is a flag with the flags it needs beside it (``needs``, in both runs)
and the value it is given; the two runs' records must differ. A flag whose effect a one-rank
run on a text model cannot show (a second rank, a vision-language model, a reward service, an
installed package) is in :data:`SHOWN_ELSEWHERE` with the test that shows it; that test must
exist. Every flag is in exactly one of the two.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from lrft.cli.flags import FLAGS
from tests.trainer.fixtures import make_reward_model
from tests.unit.trainer.flag_probe import (
    ProbeInputs,
    Record,
    base_argv,
    differences,
    make_probe_model,
    record_run,
    write_probe_data,
)

ROOT = Path(__file__).resolve().parents[3]


@attrs.frozen(kw_only=True)
class Case:
    value: tuple[str, ...]
    """The flag with its non-default value (and, for a flag of several values, all of them)."""
    needs: tuple[str, ...] = ()
    """Flags both runs get: what the flag depends on (``--lora_alpha`` needs ``--lora_rank``)."""


def case(*value: str, needs: tuple[str, ...] = ()) -> Case:
    return Case(value=value, needs=needs)


GAE = ("--advantage_estimator=gae",)
KL = ("--init_kl_coef=0.1",)
LORA = ("--lora_rank=4",)
TWO_STEPS = ("--max_steps=2",)
RELAY = ("--environment=tests.trainer.episode_env:Relay",)
TOOLS = ("--environment=tool_calls", "--tools=calculator")
OPD = ("--advantage_estimator=on_policy_distillation",)

# {inputs.X} is replaced by the probe's input paths, {root} by the run's own folder.
CASES: dict[str, Case] = {
    # model and data
    "pretrain": case("--pretrain={inputs.other_model}"),
    "prompt_data": case("--prompt_data={inputs.other_train}"),
    "eval_dataset": case("--eval_dataset={inputs.other_train}"),
    "input_key": case("--input_key=question"),
    "label_key": case("--label_key=label"),
    "reference_key": case("--reference_key=answer"),
    "apply_chat_template": case("--apply_chat_template"),
    "input_template": case("--input_template=Q: {{}} A:"),
    "prompt_max_len": case("--prompt_max_len=6"),
    "max_samples": case("--max_samples=2"),
    "eval_max_samples": case("--eval_max_samples=1"),
    "system_prompt": case("--system_prompt=Add.", needs=("--apply_chat_template",)),
    "prompt_data_probs": case(
        "--prompt_data_probs=0.9,0.1",
        needs=("--prompt_data={inputs.train},{inputs.other_train}",),
    ),
    "prompt_split": case("--prompt_split=other", needs=("--prompt_data={inputs.splits}",)),
    "eval_split": case("--eval_split=other", needs=("--eval_dataset={inputs.splits}",)),
    # rewards
    "reward_fn": case("--reward_fn=tests.trainer.fixtures:digit_fraction"),
    "reward_pretrain": case("--reward_pretrain={inputs.reward_model}"),
    "reward_weights": case("--reward_weights=2"),
    "grm_pretrain": case("--grm_pretrain={inputs.model}"),
    "grm_template": case(
        "--grm_template=pointwise-score-tag", needs=("--grm_pretrain={inputs.model}",)
    ),
    "grm_max_new_tokens": case("--grm_max_new_tokens=2", needs=("--grm_pretrain={inputs.model}",)),
    "grm_apply_chat_template": case(
        "--grm_apply_chat_template", needs=("--grm_pretrain={inputs.model}",)
    ),
    "grm_unparsable_score": case(
        "--grm_unparsable_score=0.5", needs=("--grm_pretrain={inputs.model}",)
    ),
    "reward_recipes": case("--reward_recipes={inputs.recipes}", needs=("--label_key=label",)),
    "normalize_reward": case("--normalize_reward"),
    "reward_clip": case("--reward_clip=0.5"),
    # rollout and sampling
    "n_samples_per_prompt": case("--n_samples_per_prompt=4"),
    "rollout_batch_size": case("--rollout_batch_size=4"),
    "micro_rollout_batch_size": case("--micro_rollout_batch_size=1"),
    "generate_max_len": case("--generate_max_len=6"),
    "temperature": case("--temperature=0.5"),
    "top_p": case("--top_p=0.5"),
    "use_fire_sampling": case("--use_fire_sampling"),
    "fire_first_token_temperature": case(
        "--fire_first_token_temperature=2", needs=("--use_fire_sampling",)
    ),
    "dynamic_sampling": case(
        "--dynamic_sampling", needs=("--reward_fn=tests.trainer.fixtures:exact",)
    ),
    "max_num_gen_batches": case(
        "--max_num_gen_batches=2",
        needs=("--dynamic_sampling", "--reward_fn=tests.trainer.fixtures:exact"),
    ),
    "environment": case(*RELAY),
    "environment_options": case('--environment_options={{"chat_template": false}}', needs=TOOLS),
    "tools": case(
        "--tools=python",
        needs=("--environment=tests.trainer.episode_env:ToolRelay", "--tools=calculator"),
    ),
    "max_turns": case("--max_turns=1", needs=RELAY),
    "max_episode_tokens": case("--max_episode_tokens=10", needs=RELAY),
    # engine
    "hf_decode": case("--hf_decode=static"),
    "enable_engine_sleep": case("--enable_engine_sleep"),
    # training
    "train_batch_size": case("--train_batch_size=4"),
    "micro_train_batch_size": case("--micro_train_batch_size=2"),
    "max_tokens_per_micro_batch": case(
        "--max_tokens_per_micro_batch=12", needs=("--micro_train_batch_size=2",)
    ),
    "max_epochs": case("--max_epochs=2"),
    "num_episodes": case("--num_episodes=2", needs=("--max_steps=none", "--max_samples=2")),
    "max_steps": case("--max_steps=2"),
    "actor_learning_rate": case("--actor_learning_rate=1e-3"),
    "l2": case("--l2=0.1"),
    "max_norm": case("--max_norm=0.01"),
    "gradient_checkpointing": case("--gradient_checkpointing"),
    "seed": case("--seed=7"),
    "lr_scheduler": case("--lr_scheduler=cosine"),
    "lr_warmup_ratio": case("--lr_warmup_ratio=0.5"),
    "min_lr_ratio": case("--min_lr_ratio=0.5", needs=("--lr_scheduler=cosine",)),
    "adam_betas": case("--adam_betas", "0.5", "0.9"),
    "attn_implementation": case("--attn_implementation=eager"),
    # algorithm
    "advantage_estimator": case("--advantage_estimator=rloo"),
    "eps_clip": case("--eps_clip=0.01"),
    "gamma": case("--gamma=0.5", needs=("--advantage_estimator=reinforce",)),
    "lambd": case("--lambd=0.5", needs=GAE),
    "critic_pretrain": case("--critic_pretrain={inputs.other_model}", needs=GAE),
    "critic_learning_rate": case("--critic_learning_rate=1e-2", needs=GAE),
    "value_clip": case("--value_clip=0.001", needs=(*GAE, "--critic_learning_rate=0.1")),
    "init_kl_coef": case(*KL),
    # the reference is the actor at the first rollout: the KL is zero until a step moved it
    "kl_estimator": case("--kl_estimator=k1", needs=(*KL, *TWO_STEPS)),
    "use_kl_loss": case("--use_kl_loss", needs=KL),
    "kl_target": case("--kl_target=0.001", needs=KL),
    "kl_horizon": case("--kl_horizon=10", needs=(*KL, "--kl_target=0.001", *TWO_STEPS)),
    "policy_loss_type": case("--policy_loss_type=gspo"),
    "eps_clip_low_high": case("--eps_clip_low_high", "0.01", "0.5"),
    "loss_agg_mode": case("--loss_agg_mode=seq-mean-token-sum"),
    "entropy_loss_coef": case("--entropy_loss_coef=0.1"),
    "high_entropy_token_ratio": case("--high_entropy_token_ratio=0.5"),
    "use_tis": case("--use_tis"),
    "tis_cap": case("--tis_cap=0.5", needs=("--use_tis",)),
    "overlong_buffer_len": case("--overlong_buffer_len=2"),
    "overlong_penalty_factor": case(
        "--overlong_penalty_factor=0.5", needs=("--overlong_buffer_len=2",)
    ),
    "advantage_clip": case("--advantage_clip=0.1"),
    # on-policy distillation: the estimator needs a teacher in both runs
    "teacher_pretrain": case(
        "--teacher_pretrain={inputs.other_model}", needs=(*OPD, "--teacher_pretrain={inputs.model}")
    ),
    "opd_kl_coef": case(
        "--opd_kl_coef=0.25", needs=(*OPD, "--teacher_pretrain={inputs.other_model}")
    ),
    "no_task_reward": case(
        "--no_task_reward", needs=(*OPD, "--teacher_pretrain={inputs.other_model}")
    ),
    # train backend
    "zero_stage": case("--zero_stage=2"),
    "adam_offload": case("--adam_offload"),
    "collective_timeout_s": case("--collective_timeout_s=100"),
    # LoRA
    "lora_rank": case(*LORA),
    "lora_alpha": case("--lora_alpha=64", needs=LORA),
    "lora_dropout": case("--lora_dropout=0.5", needs=LORA),
    "target_modules": case("--target_modules", "q_proj", needs=LORA),
    # outputs
    "save_path": case("--save_path={root}/elsewhere"),
    "ckpt_path": case("--ckpt_path={root}/checkpoints_here", needs=("--save_steps=1",)),
    "save_steps": case("--save_steps=1"),
    "max_ckpt_num": case("--max_ckpt_num=1", needs=("--save_steps=1", *TWO_STEPS)),
    "eval_steps": case("--eval_steps=1", needs=TWO_STEPS),
    "save_hf_model": case("--no-save_hf_model"),
    "use_tensorboard": case("--use_tensorboard"),
    "save_trajectories": case("--save_trajectories"),
    "save_trajectories_steps": case(
        "--save_trajectories_steps=2", needs=("--save_trajectories", *TWO_STEPS)
    ),
}

SHOWN_ELSEWHERE: dict[str, str] = {
    # a built-in job or demo: no --pretrain (the run brings its own model and data)
    "preset": "tests/unit/trainer/test_presets.py::test_the_preset_fills_in_model_and_data_on_a_rank",
    "cache_dir": "tests/unit/trainer/test_presets.py::test_the_preset_fills_in_model_and_data_on_a_rank",
    "demo": "tests/trainer/test_vision_demo_torchrun.py::test_the_vision_demo_trains_and_saves_pages_with_images",
    # a vision- or audio-language model
    "images_key": "tests/unit/trainer/test_media_config.py::test_image_flags_reach_the_data",
    "limit_mm_image_per_prompt": "tests/unit/trainer/test_media_config.py::test_image_flags_reach_the_data",
    "max_image_pixels": "tests/unit/trainer/test_media_config.py::test_image_flags_reach_the_data",
    "freeze_vision_tower": "tests/trainer/test_media_ranks.py::TestMediaTrainerRanks::test_frozen_vision_tower_stays_as_loaded",
    "audios_key": "tests/unit/trainer/test_audio_config.py::test_audio_flags_reach_the_data",
    "limit_mm_audio_per_prompt": "tests/unit/trainer/test_audio_config.py::test_audio_flags_reach_the_data",
    "freeze_audio_tower": "tests/unit/trainer/test_audio_config.py::test_freeze_audio_tower_freezes_the_encoder_only",
    # a reward service (an HTTP server of the test's own)
    "remote_rm_url": "tests/trainer/test_reward_flags_ranks.py::TestRewardFlagsRanks::test_reward_model_and_service_summed_with_a_rule_reward",
    "remote_rm_timeout_s": "tests/unit/rewards/test_remote.py::test_a_slow_server_times_out_on_every_try",
    "remote_rm_max_attempts": "tests/unit/rewards/test_remote.py::test_a_server_that_fails_twice_then_succeeds",
    "remote_rm_protocol": "tests/unit/rewards/test_remote_protocols.py::test_openrlhf_requests_and_replies",
    "remote_rm_batch_size": "tests/unit/rewards/test_remote_protocols.py::test_batches_are_cut_into_posts_and_joined_in_order",
    "remote_rm_max_concurrency": "tests/unit/rewards/test_remote_protocols.py::test_at_most_max_concurrency_posts_are_in_flight",
    "remote_rm_auth_env": "tests/unit/rewards/test_remote_protocols.py::test_the_auth_header_comes_from_the_environment_and_stays_secret",
    # a teacher service (an HTTP server of the test's own)
    "teacher_url": "tests/trainer/test_distill_ranks.py",
    "teacher_protocol": "tests/unit/distill/test_remote_teacher.py::test_the_teachers_logprobs_of_each_response_token",
    "teacher_auth_env": "tests/trainer/test_distill_ranks.py",
    "teacher_timeout_s": "tests/trainer/test_distill_ranks.py",
    "teacher_max_attempts": "tests/unit/distill/test_remote_teacher.py::test_retries_auth_and_redaction_follow_the_remote_rewards_rules",
    # a process reward model (scored against a plain forward on two ranks)
    "prm_pretrain": "tests/trainer/test_distill_ranks.py",
    "prm_step_separator": "tests/unit/rewards/test_process.py::test_each_separator_ends_a_step_and_the_last_token_ends_the_last",
    # a negative advantage whose ratio passes c, which a run this short does not reach
    "dual_clip": "tests/unit/algo/test_policy_loss.py::test_dual_clip_caps_the_loss_of_negative_advantages",
    # vLLM, a second rank, or FSDP2 state a one-rank CPU run cannot show
    "engine_type": "tests/trainer/test_vllm_torchrun.py::test_tp1_engine_per_rank_sized_by_engine_mem_util",
    "engine_tp_size": "tests/trainer/test_vllm_torchrun.py::test_tp2_engine_spans_both_ranks",
    "engine_mem_util": "tests/trainer/test_vllm_torchrun.py::test_tp1_engine_per_rank_sized_by_engine_mem_util",
    "fsdp_cpu_offload": "tests/conformance/test_fsdp2.py",
    "fsdp_reshard_after_forward": "tests/conformance/test_fsdp2.py",
    "fsdp_defer_gradient_sync": "tests/conformance/test_fsdp2.py",
    "deepspeed_config": "tests/conformance/test_deepspeed.py",
    # a split placement: ranks that train and ranks that roll out
    "placement": "tests/trainer/test_split_ranks.py::test_one_step_behind_trains_nothing_older",
    "rollout_world_size": "tests/trainer/test_split_ranks.py::test_one_step_behind_trains_nothing_older",
    "max_staleness": "tests/trainer/test_split_ranks.py::test_one_step_behind_trains_nothing_older",
    # the packed forwards compute what the padded ones do (the effect is the kernels' inputs);
    # sequence parallelism needs a second rank
    "packing_samples": "tests/trainer/test_long_sequence_ranks.py::TestLongSequenceRanks::test_packed_iteration_trains_actor_and_critic_as_the_padded_one",
    "sequence_parallel_size": "tests/trainer/test_long_sequence_ranks.py::TestLongSequenceRanks::test_a_sequence_parallel_group_passes_and_trains_as_the_unsplit_run",
    # a backend or sync an installed package registers
    "train_backend": "tests/trainer/test_plugin_backend_torchrun.py::test_lrft_train_trains_with_an_installed_packages_backends",
    "weight_sync": "tests/trainer/test_plugin_backend_torchrun.py::test_lrft_train_trains_with_an_installed_packages_backends",
    "plugins": "tests/unit/trainer/test_plugins.py::test_a_plugins_module_registers_what_the_command_line_then_chooses",
    # an earlier run's outputs in the save path
    "load_checkpoint": "tests/trainer/test_torchrun.py::test_sigkill_after_checkpoint_then_resume_is_bit_identical",
    "overwrite_output": "tests/trainer/test_torchrun.py::test_a_save_path_holds_one_run_and_a_resume_must_match_it",
    # a terminal on stdout
    "progress_bar": "tests/unit/trainer/test_progress.py::test_the_bar_needs_a_terminal_and_the_setting",
    # a Weights & Biases run
    "use_wandb": "tests/trainer/test_observability.py::test_wandb_runs_hold_the_jsonl_metrics_in_one_run_across_the_resume",
    "wandb_project": "tests/trainer/test_observability.py::test_wandb_runs_hold_the_jsonl_metrics_in_one_run_across_the_resume",
    "wandb_org": "tests/unit/trainer/test_lightrft_command_lines.py",
    "wandb_group": "tests/trainer/test_observability.py::test_wandb_runs_hold_the_jsonl_metrics_in_one_run_across_the_resume",
    "wandb_run_name": "tests/trainer/test_observability.py::test_wandb_runs_hold_the_jsonl_metrics_in_one_run_across_the_resume",
}


@attrs.frozen(kw_only=True)
class Inputs(ProbeInputs):
    other_model: Path
    reward_model: Path
    recipes: Path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    root = tmp_path_factory.mktemp("flag_inputs")
    train, other, held_out, splits = write_probe_data(root / "data")
    recipes = root / "recipes.json"
    recipes.write_text(json.dumps({"sum": {"probe_reward": 1.0}, "carry": {"probe_reward": 3.0}}))
    return Inputs(
        model=make_probe_model(root / "model"),
        train=train,
        other_train=other,
        held_out=held_out,
        splits=splits,
        other_model=make_probe_model(root / "other_model", seed=1),
        reward_model=make_reward_model(root / "reward_model"),
        recipes=recipes,
    )


def _record(inputs: Inputs, root: Path, extra: tuple[str, ...]) -> Record:
    root.mkdir(parents=True)
    argv = [a.format(inputs=inputs, root=root) for a in extra]
    return record_run([*base_argv(inputs, root / "out"), *argv], root)


def test_two_runs_of_the_same_flags_record_the_same(inputs: Inputs, tmp_path: Path) -> None:
    first = _record(inputs, tmp_path / "a", ())
    second = _record(inputs, tmp_path / "b", ())
    assert differences(first, second) == []
    assert first["calls"]
    assert first["metrics"]
    assert first["steps"] == 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_flag_changes_what_the_run_does(inputs: Inputs, tmp_path: Path, name: str) -> None:
    flag = CASES[name]
    without = _record(inputs, tmp_path / "without", flag.needs)
    with_flag = _record(inputs, tmp_path / "with", (*flag.needs, *flag.value))
    assert differences(without, with_flag), f"--{name} {' '.join(flag.value)} changed nothing"


def test_every_flag_is_probed_or_shown_by_a_named_test() -> None:
    names = {flag.name for flag in FLAGS}
    assert not set(CASES) & set(SHOWN_ELSEWHERE)
    missing = names - set(CASES) - set(SHOWN_ELSEWHERE)
    assert not missing, f"flags neither probed nor shown elsewhere: {sorted(missing)}"
    unknown = (set(CASES) | set(SHOWN_ELSEWHERE)) - names
    assert not unknown, f"no such flags: {sorted(unknown)}"


def test_the_tests_named_for_the_other_flags_exist() -> None:
    targets = sorted(set(SHOWN_ELSEWHERE.values()))
    # whole files: one node id pytest cannot find would stop the collection of the rest
    files = sorted({target.partition("::")[0] for target in targets})
    collect = ["--collect-only", "-q", "-p", "no:cacheprovider"]
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", *collect, *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    collected = {line.strip() for line in listed.stdout.splitlines() if "::" in line}
    for target in targets:
        if any(node == target or node.startswith(target) for node in collected):
            continue
        # A module skipped at import here (vLLM's, outside the vLLM environment) collects
        # nothing: its file must still hold the named test.
        path, _, name = target.partition("::")
        source = (ROOT / path).read_text() if (ROOT / path).is_file() else ""
        assert name, f"{target}: nothing collected from it\n{listed.stdout[-2000:]}"
        assert f"def {name.split('::')[-1]}(" in source, f"{target}: no such test in its file"
