"""The Ray backend's overhead against the local one: the same trace slice through each, alternating.

Usage: python benchmarks/ray_overhead.py [--rounds 5] [--rate-scale 1] [--out out/ray-overhead] [--json]
Each round serves tiny-random with the local backend, then with the Ray backend (default policy,
one prefill and one multiplexing worker), and replays the first 30 requests of the conversation
trace at 2% of their lengths with `tropical bench`. Percentiles pool every round's requests, so
one noisy round weighs no more than its share.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from tropical.report.tables import render
from tropical.serve.process import TROPICAL, ServerProcess

BACKENDS = ("local", "ray")
METRICS = (("ttft_s", 50), ("ttft_s", 90), ("tpot_s", 50), ("tpot_s", 90))


def bench_args(rate_scale: float) -> list[str]:
    return ["--trace", "conversation", "--limit", "30", "--length-scale", "0.02",
            "--rate-scale", f"{rate_scale:g}", "--json"]


def run_once(backend: str, rate_scale: float, out: Path) -> list[dict]:
    """One server, one bench replay; the bench's per-request lines."""
    server = ServerProcess.start(["--model", "tiny-random", "--backend", backend], out.with_suffix(".log"))
    try:
        subprocess.run([TROPICAL, "bench", "--url", server.url, *bench_args(rate_scale), "--out", str(out)],
                       check=True, capture_output=True)
    finally:
        server.stop()
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def percentiles(requests: list[dict]) -> dict[str, float]:
    """Milliseconds; TPOT only over requests with more than one output token (as bench counts it)."""
    done = [r for r in requests if r["error"] is None]
    values = {"ttft_s": [r["ttft_s"] for r in done],
              "tpot_s": [r["tpot_s"] for r in done if r["completion_tokens"] > 1]}
    return {f"{name[:4]}_p{q}_ms": float(np.percentile(values[name], q)) * 1e3 for name, q in METRICS} | {
        "requests": len(requests), "failed": len(requests) - len(done)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--out", default="out/ray-overhead")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pooled: dict[str, list[dict]] = {b: [] for b in BACKENDS}
    for round_ in range(args.rounds):
        for backend in BACKENDS:
            pooled[backend] += run_once(backend, args.rate_scale, out / f"{backend}-{round_}")
            print(f"round {round_ + 1}/{args.rounds}: {backend} done", file=sys.stderr, flush=True)
    result = {b: percentiles(reqs) for b, reqs in pooled.items()}
    if args.json:
        print(json.dumps(result))
        return
    local, ray = result["local"], result["ray"]
    rows = [[k, f"{local[k]:.1f}", f"{ray[k]:.1f}", f"{ray[k] / local[k]:.2f}"]
            for k in local if k.endswith("_ms")]
    print(render(["metric", "local", "ray", "ray / local"], rows))


if __name__ == "__main__":
    main()
