"""Per-request fingerprints of the simulator's decisions, to show a speed change decides the same.

Usage: python benchmarks/decision_fingerprint.py [--limit 3000] [--out FILE]
For each policy at the preset cluster (rate scales 1.0 and 0.5) and at 64 workers (16 and 8), one
line per cell: its hash over every request's id, first token, finish, prefill worker, decode worker
and cached tokens, then those tuples. Run it before and after a change and ``diff`` the files.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import replace
from pathlib import Path

from tropical.config import SimConfig
from tropical.sim.build import experiment
from tropical.sim.run import simulate

POLICIES = ("tropical+", "tropical", "kv-router", "kv-router-disagg", "chunked-512", "disagg", "colocated")
CELLS = ((None, 1.0), (None, 0.5), (64, 16.0), (64, 8.0))


def fingerprint(limit: int, workers: int | None, policy: str, scale: float) -> list[str]:
    """Each request's decisions as one line of text, in arrival order."""
    cfg = SimConfig(limit=limit).with_preset()
    if workers is not None:
        cfg = replace(cfg, workers=workers)
    result = simulate(experiment(cfg).with_policy(policy).at_rate(scale))
    return [f"{r.id} {r.first_token!r} {r.finish!r} {r.prefill_worker} {r.decode_worker} {r.cached}"
            for r in result.requests]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = []
    for policy in args.policies.split(","):
        for workers, scale in CELLS:
            rows = fingerprint(args.limit, workers, policy, scale)
            digest = hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]
            head = f"# {policy} workers={workers or 'preset'} scale={scale:g} {digest}"
            print(head, file=sys.stderr)
            lines += [head, *rows]
    text = "\n".join(lines) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
