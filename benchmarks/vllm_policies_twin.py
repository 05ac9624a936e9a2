"""Each policy's goodput over vLLM beside the twin's prediction for the same run: the fidelity study
over vLLM (benchmarks/vllm_policies.sh writes the runs, then calls this).

Every run (OUT/<policy>/rate-<scale>/run-<k>/) is simulated on a twin of the two instances: the
policy's roles, the instances' KV cache (vLLM's log), the very requests the client sent (its
requests.jsonl: send times, prompt and output tokens), the policy deciding by the profile the
routers were given (OUT/profile.json) and iterations timed by OUT/profile-truth.json where there is
one (the instances measured again after the runs: the speed they ran at, where the routers'
profile was measured on a machine loaded otherwise), else by that same profile. The table
gives, per policy and rate, the measured goodput as mean (min..max) over the repeats, the twin's
mean, and the twin's error; then the median and largest error over all cells. OUT/twin.json holds
every run's pair.

Usage: python benchmarks/vllm_policies_twin.py OUT   (SLO_TTFT_MS, SLO_TPOT_MS as for the runs)
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from pathlib import Path

from tropical.bench.plan import PlannedRequest
from tropical.calibration.store import load_profile
from tropical.core.metrics import goodput
from tropical.core.slo import SLO
from tropical.fidelity.twin import ServerShape, simulate_twin

ROLES = {"vllm-chunked": ("chunked", "colocated,colocated"), "disagg": ("disagg", "prefill,decode"),
         "tropical": ("tropical", "prefill,multiplex"), "tropical+": ("tropical+", "prefill,multiplex")}
RUN = re.compile(r"rate-(?P<rate>[\d.]+)/run-(?P<repeat>\d+)$")


def kv_tokens(out: Path) -> int:
    """The KV cache vLLM reported at start-up (its log), in tokens."""
    match = re.search(r"CPU KV cache size: ([\d,]+) tokens", (out / "vllm-0.log").read_text())
    if match is None:
        raise SystemExit(f"no 'CPU KV cache size' line in {out / 'vllm-0.log'}")
    return int(match.group(1).replace(",", ""))


def sent(run: Path) -> list[PlannedRequest]:
    """The requests as the client sent them: when, and with how many prompt and output tokens."""
    lines = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines() if line]
    return [PlannedRequest(r["id"], r["sent_s"], r["prompt_tokens"],
                           r["completion_tokens"] or r["max_tokens"]) for r in lines]


def pairs(out: Path, slo: SLO) -> list[dict]:
    """Every run's measured goodput and its twin's, with the rate it was replayed at."""
    predictor, shape_kv = load_profile(out / "profile.json"), kv_tokens(out)
    truth = out / "profile-truth.json"
    latency = load_profile(truth) if truth.is_file() else predictor
    rows = []
    for summary in sorted(out.glob("*/rate-*/run-*/summary.json")):
        run, name = summary.parent, summary.parents[2].name
        match = RUN.search(str(run.relative_to(out)))
        if name not in ROLES or match is None:
            continue
        policy, workers = ROLES[name]
        measured = json.loads(summary.read_text())
        shape = ServerShape(shape_kv, 16, 2048, 2048, workers)
        twin = simulate_twin(sent(run), slo, policy, shape, latency, predictor=predictor)
        rows.append({"policy": name, "rate_scale": float(match["rate"]), "repeat": int(match["repeat"]),
                     "rate_rps": measured["rate_rps"], "measured": measured["goodput_rps"],
                     "twin": goodput(twin.requests)})
    return rows


def error(measured: float, twin: float) -> float:
    """The twin's relative error (0 when both are 0)."""
    return abs(twin - measured) / measured if measured else (0.0 if twin == 0 else float("inf"))


def table(rows: list[dict]) -> str:
    cells = sorted({(r["policy"], r["rate_scale"]) for r in rows},
                   key=lambda cell: (list(ROLES).index(cell[0]), cell[1]))
    lines = ["| policy | rate (req/s) | goodput measured, mean (min..max) | twin | twin's error |",
             "| --- | ---: | ---: | ---: | ---: |"]
    errors = []
    for name, scale in cells:
        runs = [r for r in rows if (r["policy"], r["rate_scale"]) == (name, scale)]
        real, twin = [r["measured"] for r in runs], statistics.mean(r["twin"] for r in runs)
        errors.append(error(statistics.mean(real), twin))
        lines.append(f"| {name} | {statistics.mean(r['rate_rps'] for r in runs):.3f} | "
                     f"{statistics.mean(real):.3f} ({min(real):.3f}..{max(real):.3f}, n={len(real)}) | "
                     f"{twin:.3f} | {errors[-1]:.0%} |")
    lines.append(f"\nthe twin's error over {len(errors)} cells: median {statistics.median(errors):.0%}, "
                 f"largest {max(errors):.0%}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    env = os.environ.get
    slo = SLO(float(env("SLO_TTFT_MS", "3000")) / 1e3, float(env("SLO_TPOT_MS", "300")) / 1e3)
    rows = pairs(out, slo)
    if not rows:
        print(f"no runs under {out} (<policy>/rate-<scale>/run-<k>/summary.json)", file=sys.stderr)
        return 1
    (out / "twin.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
