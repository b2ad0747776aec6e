"""One SmolLM2 conversion per test session (it takes about a minute), shared by the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from lrft.presets import smollm2


@pytest.fixture(scope="session")
def smollm2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = smollm2.missing_packages()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: {smollm2.INSTALL_COMMAND}")
    return smollm2.converted_model(tmp_path_factory.mktemp("lrft-cache"))
