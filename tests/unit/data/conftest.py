from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from tests.unit.data._tokenizer import build_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()
