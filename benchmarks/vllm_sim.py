"""What the simulator predicts for benchmarks/vllm_policies.sh's setting: the same trace slice and
SLOs, two workers in each policy's roles with the vLLM instances' KV cache, priced by the profile
the benchmark measured over HTTP (``tropical profile --server``). Same metrics as the measured table.

Usage: python benchmarks/vllm_sim.py OUT_DIR   (after benchmarks/vllm_policies.sh; same env knobs)
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from tropical.bench.plan import plan_requests
from tropical.calibration.store import load_profile
from tropical.core.slo import SLO
from tropical.fidelity.twin import ServerShape, simulate_twin
from tropical.workload.catalog import load_slice

ROLES = {"vllm-chunked": ("chunked", "colocated,colocated"), "disagg": ("disagg", "prefill,decode"),
         "tropical": ("tropical", "prefill,multiplex"), "tropical+": ("tropical+", "prefill,multiplex")}
ROWS = (("TTFT P50 (ms)", "ttft_p50_s", 1e3, "{:.0f}"), ("TTFT P90 (ms)", "ttft_p90_s", 1e3, "{:.0f}"),
        ("TPOT P50 (ms)", "tpot_p50_s", 1e3, "{:.1f}"), ("TPOT P90 (ms)", "tpot_p90_s", 1e3, "{:.1f}"),
        ("SLO attainment", "attainment", 100.0, "{:.1f}%"))


def kv_tokens(out: Path) -> int:
    """The KV cache vLLM reported at start-up (its log), in tokens."""
    match = re.search(r"CPU KV cache size: ([\d,]+) tokens", (out / "vllm-0.log").read_text())
    if match is None:
        raise SystemExit(f"no 'CPU KV cache size' line in {out / 'vllm-0.log'}")
    return int(match.group(1).replace(",", ""))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    env = os.environ.get
    limit, length = int(env("LIMIT", "16")), float(env("LENGTH_SCALE", "0.05"))
    rate = float(env("RATE_SCALE", "0.1"))
    slo = SLO(float(env("SLO_TTFT_MS", "3000")) / 1e3, float(env("SLO_TPOT_MS", "300")) / 1e3)
    names = env("POLICIES", " ".join(ROLES)).split()
    planned = plan_requests(load_slice("conversation", limit), rate, length, 2048)
    latency, tokens = load_profile(out / "profile.json"), kv_tokens(out)
    flat = {}
    for name in names:
        policy, workers = ROLES[name]
        shape = ServerShape(tokens, 16, 2048, 2048, workers)
        flat[name] = simulate_twin(planned, slo, policy, shape, latency).summary().as_dict()
    print(f"simulated: {len(planned)} requests, lengths x{length:g}, rate x{rate:g}, "
          f"KV {tokens} tokens/worker")
    print("| metric | " + " | ".join(names) + " |\n| --- |" + " ---: |" * len(names))
    for label, key, scale, fmt in ROWS:
        print(f"| {label} | " + " | ".join(fmt.format(flat[n][key] * scale) for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
