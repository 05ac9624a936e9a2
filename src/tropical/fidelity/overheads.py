"""What the live server adds to its profile, read from its own /metrics and iteration log after a run."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tropical.core.latency.adjusted import AdjustedModel
from tropical.core.latency.fitted import FittedModel
from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape
from tropical.serve.iteration_log import IterationRecord


def scrape(url: str) -> dict[str, float]:
    """Every sample of the server's metrics summed over labels, by sample name."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    totals: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] += sample.value
    return dict(totals)


def adjusted(profile: LatencyModel, totals: dict[str, float]) -> AdjustedModel:
    """``profile`` scaled by the measured compute / predicted ratio (contention between workers
    and the profile's own error), plus the mean per-iteration gap between the router's wall time
    and the worker's compute (planning, pipe round trip, booking, streaming); KV moves at their
    measured speed (``transfer_scale``).
    """
    iterations = totals.get("tropical_iterations_total", 0.0)
    if not iterations:
        return AdjustedModel(profile, transfer_scale=transfer_scale(profile, totals))
    compute = totals["tropical_iteration_compute_seconds_total"]
    predicted = totals["tropical_iteration_predicted_seconds_total"]
    wall = totals["tropical_iteration_wall_seconds_total"]
    scale = compute / predicted if predicted else 1.0
    return AdjustedModel(profile, scale, max(0.0, (wall - compute) / iterations),
                         transfer_scale(profile, totals))


def transfer_scale(profile: LatencyModel, totals: dict[str, float]) -> float:
    """The server's KV moves over the profile's price for the same moves (1 if none moved).

    The router times a move as its export plus its import, without the wait for the target's
    iteration boundary, which the simulator models itself. The profile prices a move as a fixed
    cost plus a cost per token, so the same moves cost it count x the first plus tokens x the second.
    """
    count = totals.get("tropical_migrations_total", 0.0)
    seconds = totals.get("tropical_migration_seconds_sum", 0.0)
    if not count or seconds <= 0:
        return 1.0
    fixed = profile.transfer_time(0)
    per_token = (profile.transfer_time(1_000) - fixed) / 1_000
    priced = count * fixed + totals["tropical_migrated_tokens_total"] * per_token
    return seconds / priced if priced > 0 else 1.0


def measured_speed(profile: FittedModel, records: Sequence[IterationRecord], workers: int,
                   transfer: float = 1.0) -> list[AdjustedModel]:
    """Each worker's speed as the run measured it, iteration by iteration: the profile's model
    refitted to every iteration's compute time, scaled per worker so that its logged iterations
    take, in sum, the compute time they took live, plus that worker's mean gap between the
    router's wall time and its compute. A worker that ran nothing gets the pooled numbers.

    One compute scale (``adjusted``) cannot carry an error whose sign depends on the batch: the
    study's profile prices small decodes at up to twice their live time while prefills take at
    least their profiled time, and the scale, weighted by time, averages the two away. The refit
    alone follows the typical iteration (it minimizes relative error), but contention makes some
    iterations much slower than typical, never much faster, so alone it prices a contended run
    short in sum, and queues drain at the sum's pace. docs/fidelity.md gives the sizes.
    KV moves take ``transfer`` times the profile's time (``transfer_scale``).
    """
    from tropical.engine.profiler import Sample, fit_samples  # loads torch: only once a run has ended

    samples = [Sample(iteration_kind(r.shape), r.shape, r.compute) for r in records if r.compute > 0]
    fitted = fit_samples(samples, profile.kv_bytes_per_token, profile.transfer_bandwidth,
                         profile.transfer_latency).model
    pooled = _worker_speed(fitted, records, transfer)
    return [_worker_speed(fitted, mine, transfer) if (mine := [r for r in records if r.worker == w])
            else pooled for w in range(workers)]


def profile_ratio(profile: LatencyModel, records: Sequence[IterationRecord]) -> float:
    """The run's iterations' compute seconds over what ``profile`` predicts for them: how fast
    this host really ran against the profile the study decided with (above 1: slower)."""
    timed = [r for r in records if r.compute > 0]
    predicted = sum(profile.iteration_time(r.shape) for r in timed)
    return sum(r.compute for r in timed) / predicted if predicted > 0 else math.nan


def _worker_speed(fitted: FittedModel, records: Sequence[IterationRecord], transfer: float) -> AdjustedModel:
    compute = sum(r.compute for r in records)
    priced = sum(fitted.iteration_time(r.shape) for r in records)
    overhead = sum(r.wall - r.compute for r in records) / len(records)
    return AdjustedModel(fitted, compute / priced if priced > 0 else 1.0, max(0.0, overhead), transfer)


def iteration_kind(shape: BatchShape) -> str:
    """The profiler's kind of an iteration: ``decode`` only, ``prefill`` only, or ``mixed``."""
    if not shape.num_prefills:
        return "decode"
    return "mixed" if shape.decode_count else "prefill"


def frontend_latency(totals: dict[str, float], client_mean_ttft: float) -> float:
    """Mean client TTFT minus the router's own mean TTFT: what HTTP and the API layer add."""
    count = totals.get("tropical_ttft_seconds_count", 0.0)
    if not count or client_mean_ttft != client_mean_ttft:
        return 0.0
    return max(0.0, client_mean_ttft - totals["tropical_ttft_seconds_sum"] / count)
