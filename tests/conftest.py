"""Shared fixtures."""

from __future__ import annotations

import os

os.environ["TROPICAL_NATIVE"] = "0"  # tests patch and subclass the plain classes; test_native runs compiled

import pytest  # noqa: E402

from tests.factories import linear_model  # noqa: E402
from tropical.core.latency.fitted import FittedModel  # noqa: E402


@pytest.fixture
def model() -> FittedModel:
    return linear_model()
