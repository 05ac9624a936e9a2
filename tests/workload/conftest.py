"""Shared fixture: write a small trace file (gzipped when its name ends in .gz)."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def write_trace(tmp_path: Path) -> Callable[[str, str], Path]:
    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        data = text.encode()
        path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
        return path

    return write
