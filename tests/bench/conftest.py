"""Fixture: start fake OpenAI servers for a test and stop them after it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from tests.bench.fake_server import Script, serving


@pytest.fixture
def fake_server() -> Iterator[Callable[[Script], str]]:
    with ExitStack() as stack:
        yield lambda script: stack.enter_context(serving(script))
