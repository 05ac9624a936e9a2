"""Plain-text tables for the terminal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tropical.sim.run import SimResult, prefix_note
from tropical.sim.sweep import PolicyCapacity


def render(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, numbers right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    body = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


def summary_table(result: SimResult) -> str:
    """Latency percentiles and attainment of one simulated run."""
    s = result.summary
    exp = result.experiment
    rows = [[name, *(f"{getattr(dist, p):.3f}" for p in ("p50", "p90", "p99"))]
            for name, dist in (("TTFT (s)", s.ttft), ("TPOT (s)", s.tpot),
                               ("queueing (s)", s.queueing), ("E2E (s)", s.e2e),
                               ("ITL (s)", s.itl), ("longest gap (s)", s.max_gap))]
    head = (f"{exp.policy} on {exp.cluster.name} cluster, trace {exp.trace.name} "
            f"({s.requests} requests at {exp.rate_scale:g}x = "
            f"{exp.rate_scale * exp.trace.mean_rate:.2f} req/s)")
    tail = (f"SLO attainment {s.attainment:.1%}   stream attainment {s.stream_attainment:.1%}   "
            f"stalls > 1 s {s.stall_share:.1%}   completed {s.completed}   failed {s.failed}   "
            f"throughput {s.throughput_rps:.2f} req/s, {s.output_tokens_per_s:.0f} tok/s   "
            f"paths {s.paths}   prefix hit rate {s.prefix_hit_rate:.1%}   "
            f"simulated in {result.sim_wall_s:.2f} s")
    note = prefix_note(exp)
    return "\n".join([head, render(["metric", "p50", "p90", "p99"], rows), tail,
                      *([f"note: {note}"] if note else [])])


def capacity_table(found: Mapping[str, PolicyCapacity], target: float) -> str:
    """Each policy's goodput capacity under both attainments, and its ratio to the best."""
    best = max((c.capacity_rps for c in found.values()), default=0.0)
    best_stream = max((c.stream_capacity_rps for c in found.values()), default=0.0)
    rows = [[p, f"{c.capacity_rps:.3f}", f"{c.capacity_rps / best:.2f}" if best else "-",
             f"{c.stream_capacity_rps:.3f}",
             f"{c.stream_capacity_rps / best_stream:.2f}" if best_stream else "-",
             f"{c.result.rate_scale:.3f}", f"{c.wall_s:.1f}"]
            for p, c in found.items()]
    return (f"goodput capacity at {target:.0%} SLO attainment (paper: mean TPOT; stream: also "
            "every gap within the TBT SLO)\n"
            + render(["policy", "req/s", "vs best", "stream req/s", "vs best", "rate scale",
                      "search s"], rows))
