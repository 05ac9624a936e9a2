"""Why the workers' prefix caches reuse little, and whether a smarter eviction order would help.

For each trace, on the paper cluster: how long after its last use a block of a conversation's
history (any prefix block but the first) is used again, against how many seconds of new prefix
blocks the cluster's KV holds; then the share of prompt tokens one cluster-wide cache hits
(``sim.ideal_cache``) unbounded, and at the size of the cluster's KV and at half of it (running
requests hold much of a worker's KV) under each eviction order: least recently used (the
engines'), least recently used with blocks used again kept after those used once (a
frequency-aware order without the future), and furthest next use (the future known).

    .venv/bin/python benchmarks/eviction_offline.py [--traces conversation,synthetic] [--json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import numpy as np

from tropical.config import SimConfig
from tropical.report.tables import render
from tropical.sim.build import experiment
from tropical.sim.ideal_cache import FURTHEST, LRU, REUSED, ideal_hits
from tropical.workload.trace import Trace, TraceEntry

EVICTIONS = (LRU, REUSED, FURTHEST)
SIZES = (1.0, 0.5)
"""The cache's size as a share of the cluster's KV."""
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def reuse_gaps(entries: Sequence[TraceEntry]) -> list[float]:
    """Seconds between a history block's use and its previous one (the first block, which a
    whole trace may share, left out)."""
    last: dict[int, float] = {}
    gaps = []
    for entry in entries:
        for j, key in enumerate(entry.prefix_blocks):
            if j and key in last:
                gaps.append(entry.arrival - last[key])
            last[key] = entry.arrival
    return gaps


def held_seconds(trace: Trace, capacity_tokens: int) -> float:
    """Seconds of the trace's new prefix blocks (tokens first seen) that ``capacity_tokens`` hold."""
    seen: set[int] = set()
    new = 0
    for entry in trace.entries:
        for j, key in enumerate(entry.prefix_blocks):
            if key not in seen:
                seen.add(key)
                new += entry.block_tokens(j)
    return capacity_tokens / (new / trace.duration) if new and trace.duration > 0 else float("inf")


def study(trace: str) -> dict[str, object]:
    """One trace's gaps, horizon and hit shares."""
    exp = experiment(SimConfig(trace=trace).with_preset())
    entries, block = exp.trace.entries, exp.cluster.block_size
    capacity = sum(w.kv_capacity_tokens for w in exp.cluster.workers)
    prompt = sum(e.input_len for e in entries)
    gaps = reuse_gaps(entries)
    hits: dict[str, float] = {"unbounded": sum(ideal_hits(entries, block)) / prompt}
    for share in SIZES:
        for eviction in EVICTIONS:
            hits[f"{eviction} at {share:g}x KV"] = sum(
                ideal_hits(entries, block, int(share * capacity), eviction)) / prompt
    return {"trace": trace, "kv_tokens": capacity, "held_s": held_seconds(exp.trace, capacity),
            "reuse_gap_s": {f"p{int(q * 100)}": float(np.quantile(gaps, q)) if gaps else None
                            for q in QUANTILES},
            "hit_share": hits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="conversation,synthetic")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [study(trace) for trace in args.traces.split(",")]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        gaps = r["reuse_gap_s"]
        assert isinstance(gaps, dict)
        shown = " / ".join("-" if v is None else f"{v:.0f}" for v in gaps.values())
        print(f"{r['trace']}: a history block is used again {shown} s after its last use "
              f"(p10 / p25 / p50 / p75 / p90); the cluster's KV ({r['kv_tokens']:,} tokens) holds "
              f"{r['held_s']:.0f} s of new prefix blocks")
        shares = r["hit_share"]
        assert isinstance(shares, dict)
        print(render(["cache", "prompt tokens hit"], [[k, f"{v:.1%}"] for k, v in shares.items()]))
        print()


if __name__ == "__main__":
    main()
