"""Fixtures of the serve tests."""

from __future__ import annotations

import pytest

from tests.serve.greedy import greedy_reference


@pytest.fixture(scope="session")
def reference() -> list[str]:
    """The engine's greedy answers to ``greedy.PROMPTS``, which every server must reproduce."""
    return greedy_reference()
