"""Which latency profile prices the policy, for either engine: the one given (``--profile``), the
one cached for this engine, model and machine, or one measured now on the first worker and cached,
so later starts reuse it. The note returned says which happened."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tropical.calibration.store import load_profile
from tropical.core.latency.fitted import FittedModel
from tropical.engine.loader import cache_root
from tropical.engine.profiler import FIT_ERROR_KEY

Measure = Callable[[], Awaitable[tuple[FittedModel, dict[str, Any]]]]
"""Profile a started worker: the fitted model and the document to cache (``profile_document``)."""


@dataclass(frozen=True, slots=True)
class ProfileSource:
    """Where one engine's profile comes from when none is given: its cache entry's file name, and
    how to measure one (with the words the note uses for the cached one and for the measurement)."""

    cache_name: str
    measure: Measure
    cached_as: str
    measured_as: str


async def choose_profile(given: str | None, source: ProfileSource) -> tuple[FittedModel, str]:
    """The latency model, and a note saying where it came from."""
    if given is not None:
        return load_profile(given), f"latency profile {given}"
    path = cache_root(None) / "profiles" / source.cache_name
    if path.is_file():
        return load_profile(path), f"cached {source.cached_as} {path}"
    model, document = await source.measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    errors = ", ".join(f"{k} {v['median_pct']:.0f}%" for k, v in document[FIT_ERROR_KEY].items())
    return model, (f"no --profile given: profiled {source.measured_as} (median fit error {errors}); "
                   f"saved to {path}")
