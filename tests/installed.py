"""Tests that need an optional package present or absent, whatever this environment has."""

from __future__ import annotations

import pytest

from lrft import extras


def pretend_installed(monkeypatch: pytest.MonkeyPatch, **present: bool) -> None:
    """Make :func:`lrft.extras.installed` (and every probe built on it) answer ``present`` for
    the packages named, by their top-level module (``vllm=True``), and the truth for the rest."""
    real = extras.installed
    monkeypatch.setattr(
        extras,
        "installed",
        lambda package: present[package] if package in present else real(package),
    )
