"""``lrft eval``'s command line: lrft train's guard holds here too (no value of a switch or of an
unknown flag is shown), and the shared flags parse to the settings ``lrft train`` would read."""

from __future__ import annotations

import pytest

from lrft.cli import main
from lrft.cli.eval import settings_from_args

SECRET = "hf-token-5be0d2"
BASE = ["eval", "--model=m", "--dataset=d.jsonl"]


@pytest.mark.parametrize(
    "extra",
    [["--apply_chat_template", SECRET], [f"--unknown_key={SECRET}"], ["--greedy", SECRET]],
)
def test_a_value_after_a_switch_or_an_unknown_flag_is_never_shown(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*BASE, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert SECRET not in err
    assert "configuration error" in err


def test_own_and_shared_settings() -> None:
    settings, shared = settings_from_args(
        [*BASE, "--n_samples=4", "--no-greedy", "--temperature=0.7", "--apply_chat_template"]
    )
    assert (settings.n_samples, settings.ks, settings.greedy) == (4, (1, 4), False)
    assert shared == {"temperature": 0.7, "apply_chat_template": True}
