"""What a host-memory tier under each worker's prefix cache buys each policy (issue 35).

Usage: python benchmarks/host_tier.py [--host-kv 0,2,10] [--host-tier per-worker,shared]
           [--policies tropical+,kv-router] [--trace conversation] [--limit N] [--json]
For each policy, host size (``--host-kv``: host memory per worker as a multiple of its KV pool;
blocks the pool evicts wait there and load back over PCIe, priced and charged to the iteration
that waits for them) and tier (each worker's own host memory, or one store of all of it that
every worker loads from), in one run: the capacity search of ``tropical sweep`` (stream attainment),
its share of the cache-aware work bound (one ideal cluster-wide cache: it does not move with the
host size), and, at that capacity, the prefix hit rate and the share of prompt tokens loaded from
host memory. A DGX A100's 1 TB of DRAM over four two-GPU workers is about 2x their KV pools;
Mooncake's store pools the DRAM of many machines. About four minutes per cell on the full
conversation trace, compiled.
"""

from __future__ import annotations

import argparse
import json

from tropical.config import SimConfig
from tropical.report.tables import render
from tropical.sim.build import experiment
from tropical.sim.pooled_bound import PooledCluster
from tropical.sim.run import simulate
from tropical.sim.sweep import capacity


def cell(cfg: SimConfig, policy: str, host_kv: float, tier: str = "per-worker") -> dict[str, float]:
    """One policy's capacity, the work bound, and its hits and host loads at that capacity."""
    exp = experiment(cfg).with_policy(policy).with_host_kv(host_kv, tier)
    found = capacity(exp)
    scale = found.stream.rate_scale if found.stream is not None else found.result.rate_scale
    at_capacity = simulate(exp.at_rate(scale))
    return {"capacity_rps": found.stream_capacity_rps, "bound_rps": PooledCluster.of(exp).bound.rate_rps,
            "prefix_hit_rate": at_capacity.summary.prefix_hit_rate,
            "host_load_rate": at_capacity.host_load_rate}


def row(key: str, c: dict[str, float]) -> list[str]:
    """One table row of the cell ``policy@size@tier``."""
    policy, size, tier = key.split("@")
    return [policy, size, tier if float(size) else "-", f"{c['capacity_rps']:.3f}",
            f"{c['capacity_rps'] / c['bound_rps']:.0%}", f"{c['prefix_hit_rate']:.1%}",
            f"{c['host_load_rate']:.1%}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-kv", default="0,2,10", help="host sizes, as multiples of the KV pool")
    parser.add_argument("--host-tier", default="per-worker,shared", help="per-worker, shared or both")
    parser.add_argument("--policies", default="tropical+,kv-router")
    parser.add_argument("--trace", default="conversation")
    parser.add_argument("--limit", type=int, default=None, help="first N requests (default all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [float(f) for f in args.host_kv.split(",")]
    cfg = SimConfig(trace=args.trace, limit=args.limit).with_preset()
    try:
        out = {f"{p}@{f:g}@{t}": cell(cfg, p, f, t) for p in args.policies.split(",") for f in sizes
               for t in (args.host_tier.split(",") if f else ["per-worker"])}
    except ValueError as err:
        parser.error(str(err))
    if args.json:
        print(json.dumps(out))
        return
    rows = [row(key, c) for key, c in out.items()]
    print(render(["policy", "host x KV pool", "tier", "capacity req/s (stream)", "of the work bound",
                  "hit rate there", "loaded from host there"], rows))


if __name__ == "__main__":
    main()
