"""Resolve a trace by built-in name or file path, so callers need not know file formats."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from importlib.resources import as_file, files
from pathlib import Path

from tropical.workload.loaders import PathLike, TraceError, load_csv, load_mooncake
from tropical.workload.trace import Trace
from tropical.workload.transform import LengthBounds, arrivals, at_rate, bound_lengths, scale_lengths, take

UNBOUNDED = LengthBounds()

# Built-in name -> gzipped file shipped in tropical/data/traces (see ATTRIBUTION.md there).
BUILTIN_TRACES: dict[str, str] = {
    "conversation": "conversation_trace.jsonl.gz",
    "synthetic": "synthetic_trace.jsonl.gz",
    "azure-code": "AzureLLMInferenceTrace_code.csv.gz",
}


def load_trace(name_or_path: str | PathLike) -> Trace:
    """A built-in trace by name, else a trace file chosen by suffix (.jsonl or .csv, maybe .gz).

    Built-in names take precedence over same-named files.
    """
    if name_or_path in BUILTIN_TRACES:
        return _load_builtin(name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise TraceError(
            f"{name_or_path}: no such built-in trace or file"
            f" (built-in traces: {', '.join(BUILTIN_TRACES)})"
        )
    return _load_file(path)


def load_slice(
    name_or_path: str | PathLike,
    limit: int | None = None,
    how: str = "trace",
    seed: int = 0,
    start_s: float | None = None,
    end_s: float | None = None,
    *,
    rate: float | None = None,
    arrival_cv: float = 1.0,
    length_scale: float = 1.0,
    bounds: LengthBounds = UNBOUNDED,
) -> Trace:
    """The requests a run replays: a slice of the trace (see ``take``) with ``how`` arrivals, or
    with arrivals at ``rate`` req/s (gaps of CV ``arrival_cv``; needed by an untimed trace), then
    lengths times ``length_scale`` clamped into ``bounds``.

    The simulator and the HTTP benchmark both call this, so they replay the same requests.
    """
    trace = load_trace(name_or_path)
    if rate is not None:
        trace = take(at_rate(trace, rate, arrival_cv, seed), limit, start_s, end_s)
    elif arrival_cv != 1.0:
        raise ValueError("--arrival-cv shapes the arrivals --rate makes; give --rate too")
    elif not trace.timed:
        raise ValueError(f"trace {name_or_path} has no arrival times; give a request rate (--rate R)")
    else:
        trace = arrivals(take(trace, limit, start_s, end_s), how, seed)
    return bound_lengths(scale_lengths(trace, length_scale), bounds)


@cache
def _load_builtin(name: str) -> Trace:
    """Cached: sweeps load the same built-in trace many times, and Traces are immutable."""
    with as_file(files("tropical") / "data" / "traces" / BUILTIN_TRACES[name]) as path:
        return replace(_load_file(path), name=name)


def _load_file(path: Path) -> Trace:
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".jsonl"):
        return load_mooncake(path)
    if name.endswith(".csv"):
        return load_csv(path)
    raise TraceError(f"{path}: unknown trace format; expected .jsonl or .csv (optionally .gz)")
