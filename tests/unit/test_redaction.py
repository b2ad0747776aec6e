"""``lrft.redaction``: which parts of a URL are hidden, in a URL, in text and in a config."""

from __future__ import annotations

import pytest

from lrft.redaction import REDACTED, is_secret_name, redact, redact_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000/score", "http://127.0.0.1:8000/score"),
        ("https://alice:s3cret@rm.example.com/score", "https://***@rm.example.com/score"),
        ("https://token-only@rm.example.com/", "https://***@rm.example.com/"),
        (
            "http://h/score?task=math&api_key=K1&n=2",
            "http://h/score?task=math&api_key=***&n=2",
        ),
        ("http://h/?Access_Token=abc&Signature=def", "http://h/?Access_Token=***&Signature=***"),
        ("http://h/#access_token=abc", "http://h/#access_token=***"),
        ("http://h/?monkey=1", "http://h/?monkey=***"),  # a name that only looks like one: hidden
        ("http://h/?token", "http://h/?token"),  # a flag, no value to hide
        ("http://[broken/", "http://***"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_every_url_in_a_text_and_a_comma_separated_list() -> None:
    text = "POST http://u:p1@a/x?token=T1,https://v:p2@b/y?ids=1,2&sig=S2 failed: 'http://c/'"
    assert redact(text) == (
        "POST http://***@a/x?token=***,https://***@b/y?ids=1,2&sig=*** failed: 'http://c/'"
    )


def test_known_secrets_are_hidden_anywhere_in_a_text() -> None:
    assert redact("echo: Bearer abc123 and abc123", secrets=["abc123", ""]) == (
        f"echo: Bearer {REDACTED} and {REDACTED}"
    )


def test_a_config_keeps_its_shape_and_loses_its_secrets() -> None:
    config = {
        "remote_rm_url": ["http://u:pw@h/score", "http://h2/score?key=k"],
        "pair": ("http://u:pw@h", 3),
        "nested": {"deep": ["http://u:pw@h"]},
        "seed": 42,
        "flag": None,
    }
    assert redact(config) == {
        "remote_rm_url": ["http://***@h/score", "http://h2/score?key=***"],
        "pair": ("http://***@h", 3),
        "nested": {"deep": ["http://***@h"]},
        "seed": 42,
        "flag": None,
    }
    assert config["remote_rm_url"] == ["http://u:pw@h/score", "http://h2/score?key=k"]


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("Authorization", True),
        ("X-Api-Key", True),
        ("Cookie", True),
        ("access_token", True),
        ("content-type", False),
        ("task", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret
