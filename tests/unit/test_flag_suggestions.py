"""A mistyped flag is refused with the closest flags the command knows, its value never
shown."""

from __future__ import annotations

import pytest

from lrft.cli import main


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["train", "--n_sample_per_prompt", "8"],
            "lrft: configuration error: unknown flag --n_sample_per_prompt (did you mean "
            "--n_samples_per_prompt?) (values not shown; `lrft train --help` lists every flag)",
        ),
        (
            ["eval", "--model", "m", "--dataset", "d", "--temprature=secret"],
            "unknown flag --temprature (did you mean --temperature?)",
        ),
    ],
)
def test_train_and_eval_name_the_closest_flag(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert line in err
    assert "secret" not in err
    assert " 8" not in err


def test_a_parser_error_names_the_closest_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["train-rm", "--train_batchsize", "8"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --train_batchsize 8" in err
    assert "--train_batchsize: did you mean --train_batch_size or" in err


def test_a_flag_like_nothing_known_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--zzzz_qqqq", "1"]) == 2
    assert "did you mean" not in capsys.readouterr().err
