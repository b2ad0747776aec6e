"""``torchrun --nproc_per_node 2 -m lrft train`` when something goes wrong, on gloo: a rank
stopped with SIGSTOP is named with its phase and step, a configuration error is one line whose
exit code torchrun's summary shows, and credentials planted in the reward services' URLs and
auth variable reach no file the run writes and no line any rank prints."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.fixtures import REWARD_FLAG, base_args, make_model_folder, make_prompt_files
from tests.trainer.test_torchrun import ROOT, _command, output_of_stopped_job
from tests.trainer.wandb_offline import OFFLINE_ENV, offline_runs
from tests.unit.rewards.test_remote import ScriptedServer, length_scores


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("failure_inputs")
    train, held_out = make_prompt_files(root / "data")
    return make_model_folder(root / "model"), train, held_out


def _env(**extra: str) -> dict[str, str]:
    # This tree's lrft first (an installed lrft may be another checkout's), then the tests.
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", **extra)


def _run(args: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _command(args), env=_env(**extra), capture_output=True, text=True, timeout=300, check=False
    )


LRFT_FRAME = re.compile(r'File ".*/lrft/')
"""A traceback frame in lrft's code: torchrun's own traceback (it always prints one when a
worker fails) has frames in torch only."""


def _without_eval(args: list[str]) -> list[str]:
    return [arg for arg in args if not arg.startswith("--eval_dataset")]


def test_a_rank_stopped_by_sigstop_is_named_with_its_phase_and_step(
    inputs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    model, train, held_out = inputs
    args = _without_eval(base_args(model, train, held_out, tmp_path / "out"))
    args[args.index(REWARD_FLAG)] = (
        "--reward_fn=tests.trainer.fixtures:digit_fraction_but_rank1_stops"
    )
    timeout = 10.0
    code, output = output_of_stopped_job(
        _command([*args, "--max_steps=3", f"--collective_timeout_s={timeout}"]),
        _env(LRFT_TEST_STOP_AT="9"),
    )
    # while rank 0 waits: one line as soon as rank 1 has been silent for timeout / 2
    stall = re.search(
        r"lrft: rank 0: rank 1 has not been heard from for (\d+) s \(its last report: phase "
        r"'rewards' of step 2; rank 0 is in phase '(\w+)' of step 2\): it is stopped, dead or "
        r"stuck; collectives fail after 10 s \(--collective_timeout_s\)",
        output,
    )
    assert stall is not None, output[-4000:]
    assert 5 <= int(stall.group(1)) < timeout
    # then the timeout itself: one line, this rank, its phase and step, and the stopped peer
    failure = re.search(
        r"lrft: rank 0: a collective did not complete within 10 s \(--collective_timeout_s\) in "
        r"phase '(\w+)' of step 2; rank 1 last reported phase 'rewards' of step 2 (\d+) s ago; "
        r"the backend said: .*[Tt]imed out",
        output,
    )
    assert failure is not None, output[-4000:]
    assert failure.group(1) == stall.group(2)  # the collective rank 0 was waiting in all along
    assert int(failure.group(2)) >= timeout - 1
    assert not LRFT_FRAME.search(output)  # no rank printed a traceback (torchrun prints its own)
    # torchrun exits 1 for any failed worker; its summary keeps lrft's code and line
    assert code == 1
    assert re.search(r"exitcode\s+: 3 ", output), output[-3000:]
    assert re.search(r"traceback : lrft: rank 0: a collective did not complete", output)


def test_a_configuration_error_under_torchrun_is_one_line_with_its_code_in_the_summary(
    inputs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, train, held_out = inputs
    missing = tmp_path / "no_such_model"
    args = base_args(missing, train, held_out, tmp_path / "out")
    done = _run(args)
    line = (
        f"lrft: configuration error: --pretrain {str(missing)!r}: no such folder (expected a "
        "Hugging Face model folder (config.json, weights, tokenizer files))"
    )
    workers = done.stderr.split("lrft FAILED")[0]
    printed = [text for text in workers.splitlines() if text.startswith("lrft")]
    # torchrun stops the other worker as soon as one exits, so under load the second rank may
    # be stopped before it prints: each rank that printed printed the one line, and nothing else.
    assert set(printed) == {line}, printed
    assert len(printed) <= 2, printed
    assert not LRFT_FRAME.search(done.stderr)  # no rank printed a traceback
    assert "Repo id must be" not in done.stderr
    assert done.returncode == 1  # torchrun's own code for a failed worker
    assert re.search(r"exitcode\s+: 2 ", done.stderr), done.stderr[-3000:]
    assert f"traceback : {line}" in done.stderr


PASSWORD, QUERY_TOKEN, QUERY_KEY, ENV_TOKEN = "pw-c0ffee", "qt-5e1f", "qk-77aa", "env-d1ce"


def _service(requests: list[dict[str, str]]) -> ScriptedServer:
    """Scores with ``length_scores`` and records what each request carried; answers each
    batch's first POST with HTTP 500 (echoing the credentials it got), its retry with 200."""
    failed: set[str] = set()

    def script(n: int, body: dict[str, Any]) -> tuple[int, Any]:
        seen, path = server.headers[-1], server.paths[-1]
        requests.append({"path": path, "authorization": seen.get("authorization", "")})
        batch = path + json.dumps(body, sort_keys=True)
        if batch not in failed:
            failed.add(batch)
            return 500, {"error": "warming up", "seen": seen.get("authorization"), "path": path}
        return 200, length_scores(body)

    server = ScriptedServer(script)
    return server


def _files_with(root: Path, secrets: tuple[str, ...]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            hits = [s for s in secrets if s.encode() in data]
            if hits:
                found[str(path.relative_to(root))] = hits
    return found


def test_planted_credentials_reach_no_file_and_no_console_line(
    inputs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    model, train, held_out = inputs
    requests: list[dict[str, str]] = []
    server = _service(requests)
    port = server.httpd.server_address[1]
    with_userinfo = f"http://alice:{PASSWORD}@127.0.0.1:{port}/one?task=add&token={QUERY_TOKEN}"
    with_header = f"http://127.0.0.1:{port}/two?api_key={QUERY_KEY}"
    save = tmp_path / "out"
    args = [
        arg
        for arg in base_args(model, train, held_out, save)
        if arg not in (REWARD_FLAG, "--reference_key=answer")
    ]
    flags = [
        f"--remote_rm_url={with_userinfo},{with_header}",
        "--remote_rm_auth_env=,LRFT_TEST_RM_TOKEN",
        "--max_steps=2",
        "--save_steps=1",
        "--save_trajectories",
        "--use_tensorboard",
        "--use_wandb",
    ]
    try:
        done = _run([*args, *flags], **OFFLINE_ENV, WANDB_DIR="", LRFT_TEST_RM_TOKEN=ENV_TOKEN)
    finally:
        server.close()
    assert done.returncode == 0, done.stderr[-4000:]
    # the credentials did go out, each to its own service only
    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    one = {r["authorization"] for r in requests if r["path"].startswith("/one")}
    two = {r["authorization"] for r in requests if r["path"].startswith("/two")}
    assert one == {f"Basic {basic}"}
    assert two == {f"Bearer {ENV_TOKEN}"}
    assert {r["path"] for r in requests} == {
        f"/one?task=add&token={QUERY_TOKEN}",
        f"/two?api_key={QUERY_KEY}",
    }
    # everything the run writes is there, so the search below has something to search
    written = {str(p.relative_to(save)) for p in save.rglob("*") if p.is_file()}
    for expected in (
        "metrics.jsonl",
        "checkpoints/global_step1/manifest.json",
        "trajectories/step_00000002.jsonl",
        "hf_model/config.json",
    ):
        assert expected in written, sorted(written)
    assert any(name.startswith("tensorboard/events.out.tfevents") for name in written)
    assert offline_runs(save / "wandb"), sorted(written)
    secrets = (PASSWORD, QUERY_TOKEN, QUERY_KEY, ENV_TOKEN, basic)
    assert _files_with(save, secrets) == {}
    console = done.stdout + done.stderr
    assert [s for s in secrets if s in console] == []
    # the retries were logged on the console, redacted, and counted in the metrics
    assert re.search(
        r"reward 'remote_0': POST http://\*\*\*@127\.0\.0\.1:\d+/one\?task=add&token=\*\*\*: "
        r"attempt 1 of 3 failed \(HTTP 500\); retrying in 0\.5 s",
        console,
    ), console[-3000:]
    assert "reward 'remote_1': POST http://127.0.0.1:" in console
    rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row["kind"] == "train"]
    assert [row["step"] for row in steps] == [1, 2]
    for row in steps:  # every batch's first POST failed once, on both ranks
        assert row["reward/remote_0/http_retries"] == 1.0
        assert row["reward/remote_1/http_retries"] == 1.0
    # and the config kept in the manifest says where the services were, without the secrets
    manifest = (save / "checkpoints/global_step1/manifest.json").read_text()
    assert f"http://***@127.0.0.1:{port}/one?task=add&token=***" in manifest
    assert '"remote_rm_auth_env": [\n   "",\n   "LRFT_TEST_RM_TOKEN"' in manifest
