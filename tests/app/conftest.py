"""Fixtures of the history tests: SmolLM2's tokenizer where provisioned, and a tiny ChatML one."""

from __future__ import annotations

from typing import Any

import pytest

from tests.app.conversation_factories import SMOLLM2_PATH, make_chatml_tokenizer


@pytest.fixture(scope="module")
def smollm2() -> Any:
    if not (SMOLLM2_PATH / "tokenizer.json").is_file():
        pytest.skip(f"SmolLM2 not provisioned at {SMOLLM2_PATH} (scripts/setup_test_deps.sh)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(SMOLLM2_PATH))


@pytest.fixture(params=["smollm2", "chatml"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    if request.param == "smollm2":
        return request.getfixturevalue("smollm2")
    return make_chatml_tokenizer()
