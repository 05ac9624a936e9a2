"""Both engines choose their latency profile alike: the one given, else the cached one, else one
measured now, cached for the next start."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.factories import linear_model
from tropical.core.latency.fitted import FittedModel
from tropical.serve.profiles import ProfileSource, choose_profile


def source(measured: list[int]) -> ProfileSource:
    model = linear_model(prefill_per_token=3e-4)

    async def measure() -> tuple[FittedModel, dict[str, Any]]:
        measured.append(1)
        return model, {**model.to_dict(), "fit_error": {"prefill": {"median_pct": 4.2}}}

    return ProfileSource("engine-model.json", measure, "latency profile of the engine", "worker 0")


def test_a_profile_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TROPICAL_CACHE", str(tmp_path))
    measured: list[int] = []
    first, note = asyncio.run(choose_profile(None, source(measured)))
    cached = tmp_path / "profiles" / "engine-model.json"
    assert note == f"no --profile given: profiled worker 0 (median fit error prefill 4%); saved to {cached}"
    again, note = asyncio.run(choose_profile(None, source(measured)))
    assert note == f"cached latency profile of the engine {cached}"
    assert measured == [1] and again == first


@pytest.mark.parametrize("cached", [False, True])
def test_a_given_profile_wins_over_the_cache_and_is_never_measured(tmp_path, monkeypatch, cached):
    monkeypatch.setenv("TROPICAL_CACHE", str(tmp_path))
    if cached:
        asyncio.run(choose_profile(None, source([])))
    given = tmp_path / "given.json"
    given.write_text(json.dumps(linear_model().to_dict()))
    measured: list[int] = []
    model, note = asyncio.run(choose_profile(str(given), source(measured)))
    assert model == linear_model() and note == f"latency profile {given}" and not measured
