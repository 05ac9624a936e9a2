"""Goodput capacity: the highest rate scale whose SLO attainment stays at or above a target.

Bisection in the style of DistServe's simulator: bracket the target by doubling or halving,
then halve the bracket until it is within a relative tolerance. Attainment is assumed to fall
as the rate grows; the answer is the bracket's low end, a rate known to attain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """The highest attaining scale found, and every (scale, attainment) probed on the way."""

    rate_scale: float
    probes: list[tuple[float, float]] = field(default_factory=list)
    rel_tol: float = 0.02


def find_capacity(attainment_at: Callable[[float], float], *, target: float = 0.9,
                  start: float = 1.0, rel_tol: float = 0.02, min_scale: float = 1e-3,
                  max_scale: float = 1e3) -> CapacityResult:
    """Bisect for the largest scale with ``attainment_at(scale) >= target``.

    Returns 0 when even ``min_scale`` misses the target, and the largest probed scale when no
    probe up to ``max_scale`` misses it.
    """
    if not 0 < target <= 1:
        raise ValueError(f"target attainment must lie in (0, 1], got {target}")
    if not 0 < rel_tol < 1:
        raise ValueError(f"relative tolerance must lie in (0, 1), got {rel_tol}")
    probes: list[tuple[float, float]] = []

    def ok(scale: float) -> bool:
        value = attainment_at(scale)
        probes.append((scale, value))
        return value >= target

    lo, hi = _bracket(ok, start, min_scale, max_scale)
    if lo == 0.0 or lo == hi:
        return CapacityResult(lo, probes, rel_tol)
    while (hi - lo) > rel_tol * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return CapacityResult(lo, probes, rel_tol)


def _bracket(ok: Callable[[float], bool], start: float, min_scale: float,
             max_scale: float) -> tuple[float, float]:
    """(lo, hi) with ok(lo) and not ok(hi), by doubling up or halving down from ``start``."""
    if ok(start):
        lo = start
        while lo * 2 <= max_scale:
            if not ok(lo * 2):
                return lo, lo * 2
            lo *= 2
        return lo, lo
    hi = start
    while hi / 2 >= min_scale:
        if ok(hi / 2):
            return hi / 2, hi
        hi /= 2
    return 0.0, hi
