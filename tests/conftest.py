"""Shared fixtures."""

from __future__ import annotations

import pytest

from tests.factories import linear_model
from tropical.core.latency.fitted import FittedModel


@pytest.fixture
def model() -> FittedModel:
    return linear_model()
