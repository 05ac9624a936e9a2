"""Pure reshaping of a Trace (request rate, lengths, slicing) so sweeps reuse one loaded trace."""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, replace

import numpy as np

from tropical.workload.trace import PREFIX_BLOCK_TOKENS, Trace, TraceEntry


def scale_rate(trace: Trace, rate_scale: float) -> Trace:
    """The same requests arriving ``rate_scale`` times as often (arrivals divided by it)."""
    _check_positive("rate_scale", rate_scale)
    entries = tuple(replace(e, arrival=e.arrival / rate_scale) for e in trace.entries)
    return replace(trace, entries=entries)


def spread_ticks(trace: Trace, seed: int = 0) -> Trace:
    """Requests sharing a timestamp spread uniformly (seeded) over the gap to the next one.

    Mooncake's conversation trace rounds arrivals to ~3 s ticks, so about ten requests share
    each timestamp; replayed literally, every tick is a burst no cluster can absorb within a 5x
    TTFT SLO. Spreading them within their tick restores the arrival process the rounding hid.
    """
    times = np.array([e.arrival for e in trace.entries])
    if len(times) < 2:
        return trace
    ticks, starts, counts = np.unique(times, return_index=True, return_counts=True)
    gaps = np.diff(ticks)
    gaps = np.append(gaps, np.median(gaps) if len(gaps) else 0.0)
    rng = np.random.default_rng(seed)
    spread = times.copy()
    for tick, start, count, gap in zip(ticks, starts, counts, gaps, strict=True):
        if count > 1:
            spread[start:start + count] = tick + np.sort(rng.uniform(0.0, gap, count))
    entries = tuple(replace(e, arrival=float(t)) for e, t in zip(trace.entries, spread, strict=True))
    return replace(trace, entries=entries)


def poisson_arrivals(trace: Trace, seed: int = 0) -> Trace:
    """The trace's requests in order, arriving as a Poisson process at the trace's mean rate."""
    if len(trace) < 2 or trace.mean_rate <= 0:
        return trace
    return at_rate(trace, trace.mean_rate, 1.0, seed)


def at_rate(trace: Trace, rate: float, cv: float = 1.0, seed: int = 0) -> Trace:
    """The trace's requests in order, the first at 0, then gaps of mean ``1/rate`` seconds.

    The gaps are gamma-distributed with coefficient of variation ``cv``: 1 is a Poisson process,
    above 1 bursts (many short gaps, a few long ones), below 1 more regular arrivals.
    """
    _check_positive("rate", rate)
    _check_positive("arrival_cv", cv)
    if not trace.entries:
        return replace(trace, timed=True)
    shape = 1.0 / cv**2
    gaps = np.random.default_rng(seed).gamma(shape, 1.0 / (rate * shape), len(trace) - 1)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps)])
    entries = tuple(replace(e, arrival=float(t)) for e, t in zip(trace.entries, arrivals, strict=True))
    return replace(trace, entries=entries, timed=True)


ARRIVALS = {"trace": lambda t, seed: t, "spread": spread_ticks, "poisson": poisson_arrivals}


def arrivals(trace: Trace, how: str, seed: int) -> Trace:
    """Arrival times as recorded ('trace'), de-quantized ('spread'), or Poisson ('poisson')."""
    if how not in ARRIVALS:
        raise ValueError(f"unknown arrivals {how!r}; choose from {', '.join(ARRIVALS)}")
    return ARRIVALS[how](trace, seed)


def scale_lengths(trace: Trace, length_scale: float) -> Trace:
    """Input and output lengths times ``length_scale``, rounded, at least 1.

    Prefix blocks are dropped when the scale is not 1 (and the trace's ``prefix_note`` says so):
    they describe the original prompt's tokens, and keeping them would claim cache hits for
    tokens that no longer exist.
    """
    _check_positive("length_scale", length_scale)
    if length_scale == 1:
        return trace
    entries = tuple(
        replace(
            e,
            input_len=_scaled(e.input_len, length_scale),
            output_len=_scaled(e.output_len, length_scale),
            prefix_blocks=(),
        )
        for e in trace.entries
    )
    dropped = any(e.prefix_blocks for e in trace.entries)
    note = (f"lengths scaled by {length_scale:g}: the trace's prefix blocks no longer describe the "
            "prompts, so no prompt reuses a cached prefix") if dropped else trace.prefix_note
    return replace(trace, entries=entries, prefix_note=note)


@dataclass(frozen=True, slots=True)
class LengthBounds:
    """Clamps on prompt and output lengths (None: unbounded), so a scaled slice stays servable."""

    min_input: int | None = None
    max_input: int | None = None
    min_output: int | None = None
    max_output: int | None = None

    def __post_init__(self) -> None:
        for side in ("input", "output"):
            low, high = getattr(self, f"min_{side}"), getattr(self, f"max_{side}")
            for name, value in ((f"min_{side}", low), (f"max_{side}", high)):
                if value is not None and value < 1:
                    raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
            if low is not None and high is not None and low > high:
                raise ValueError(f"--min-{side} ({low}) is above --max-{side} ({high})")


def bound_lengths(trace: Trace, bounds: LengthBounds) -> Trace:
    """Each request's lengths clamped into ``bounds``; requests are kept, never dropped, so the
    arrival process (and the rate) stays the trace's. A clamped prompt keeps only the prefix
    blocks that were whole in the original and still are (the others' tokens changed)."""
    entries = []
    for e in trace.entries:
        prompt = _clamped(e.input_len, bounds.min_input, bounds.max_input)
        blocks = e.prefix_blocks
        if prompt != e.input_len:
            blocks = blocks[:min(e.input_len, prompt) // PREFIX_BLOCK_TOKENS]
        entries.append(replace(e, input_len=prompt, prefix_blocks=blocks,
                               output_len=_clamped(e.output_len, bounds.min_output, bounds.max_output)))
    return replace(trace, entries=tuple(entries))


def take(
    trace: Trace,
    limit: int | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
) -> Trace:
    """The first ``limit`` requests arriving in ``[start_s, end_s)``, re-based to start at 0.

    Assumes entries sorted by arrival, as every loader guarantees.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if start_s is not None and end_s is not None and end_s < start_s:
        raise ValueError(f"end_s ({end_s}) is before start_s ({start_s})")
    entries = trace.entries
    lo = 0 if start_s is None else bisect_left(entries, start_s, key=_arrival)
    hi = len(entries) if end_s is None else bisect_left(entries, end_s, key=_arrival)
    if limit is not None:
        hi = min(hi, lo + limit)
    return replace(trace, entries=_rebased(entries[lo:hi]))


def _rebased(entries: tuple[TraceEntry, ...]) -> tuple[TraceEntry, ...]:
    """Entries shifted so the first arrives at 0."""
    if not entries or entries[0].arrival == 0:
        return entries
    first = entries[0].arrival
    return tuple(replace(e, arrival=e.arrival - first) for e in entries)


def _arrival(entry: TraceEntry) -> float:
    return entry.arrival


def _scaled(length: int, scale: float) -> int:
    return max(1, round(length * scale))


def _clamped(value: int, low: int | None, high: int | None) -> int:
    if low is not None:
        value = max(value, low)
    return value if high is None else min(value, high)


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
