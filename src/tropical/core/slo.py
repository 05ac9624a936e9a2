"""Service-level objectives: per-request TTFT, TPOT and TBT targets, absolute or relative.

The paper sets each request's TTFT SLO to a multiple of its light-load TTFT (its prefill alone on
an idle worker) and we use the same scale for TPOT (one decode iteration alone at the request's
context). Absolute targets in milliseconds override the scales. The TBT target (the longest
allowed gap between two tokens) is a multiple of the TPOT target: 5x by default, Sarathi-Serve's
relaxed bound.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from tropical.core.latency.iterations import decode_time, prefill_time
from tropical.core.latency.model import LatencyModel


@dataclass(slots=True)
class SLO:
    """One request's targets, in seconds. ``tbt`` bounds every single gap between two tokens
    (stream attainment); unbounded unless set. A value, hashed as a frozen one would be: never
    change one (one per request, so it writes its constructor, which mypyc compiles; see
    ``BatchShape``)."""

    ttft: float
    tpot: float
    tbt: float = math.inf

    def __init__(self, ttft: float, tpot: float, tbt: float = math.inf) -> None:
        self.ttft = ttft
        self.tpot = tpot
        self.tbt = tbt

    def __hash__(self) -> int:
        return hash((self.ttft, self.tpot, self.tbt))

    def __reduce__(self) -> tuple[type[SLO], tuple[float, float, float]]:
        """Rebuilt from its targets: compiled, its written constructor runs on every restore,
        so pickle's default (a bare object, then its attributes) cannot make one."""
        return SLO, (self.ttft, self.tpot, self.tbt)


@dataclass(frozen=True, slots=True)
class SLOSpec:
    """How to derive a request's SLO: scales of its light-load latency, or absolute ms."""

    ttft_scale: float = 5.0
    tpot_scale: float = 5.0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    tbt_scale: float = 5.0

    def __post_init__(self) -> None:
        for name in ("ttft_scale", "tpot_scale", "ttft_ms", "tpot_ms", "tbt_scale"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"SLO {name} must be positive, got {value}")

    def resolve(self, prompt_len: int, reference: LatencyModel) -> SLO:
        """This request's SLO, priced on ``reference`` (the cluster's reference replica)."""
        ttft = (self.ttft_ms / 1e3 if self.ttft_ms is not None
                else self.ttft_scale * prefill_time(reference, prompt_len))
        tpot = (self.tpot_ms / 1e3 if self.tpot_ms is not None
                else self.tpot_scale * decode_time(reference, 1, prompt_len))
        return SLO(ttft=ttft, tpot=tpot, tbt=self.tbt_scale * tpot)


@dataclass(frozen=True, slots=True)
class SLOMix:
    """Per-request SLO classes: each request draws one class, by share, from a seeded stream."""

    classes: tuple[tuple[float, SLOSpec], ...]
    seed: int = 0

    def __post_init__(self) -> None:
        shares = [share for share, _ in self.classes]
        if not shares or any(s <= 0 for s in shares):
            raise ValueError("SLO classes need positive shares")

    def assign(self, count: int) -> list[SLOSpec]:
        """The class of each of ``count`` requests (a deterministic draw for the seed)."""
        rng = random.Random(self.seed)
        weights = [share for share, _ in self.classes]
        specs = [spec for _, spec in self.classes]
        return rng.choices(specs, weights=weights, k=count)
