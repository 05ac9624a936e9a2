"""Tropical vs vLLM as Markdown tables, from the `tropical bench` outputs benchmarks/vs_vllm.sh wrote.

Usage: python benchmarks/vs_vllm_report.py OUT_DIR SYSTEM [SYSTEM ...]
Systems named vllm* are the baselines; every other system gets a ratio column against each of them.
Ratios are ours / vLLM: above 1 is better for throughput, attainment and goodput, below 1 for latencies.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# (row label, summary key, scale to the unit shown, format)
METRICS = (
    ("completed req/s", "throughput_rps", 1.0, "{:.2f}"),
    ("output tok/s", "output_tokens_per_s", 1.0, "{:.1f}"),
    ("TTFT P50 (ms)", "ttft_p50_s", 1e3, "{:.0f}"),
    ("TTFT P90 (ms)", "ttft_p90_s", 1e3, "{:.0f}"),
    ("TPOT P50 (ms)", "tpot_p50_s", 1e3, "{:.1f}"),
    ("TPOT P90 (ms)", "tpot_p90_s", 1e3, "{:.1f}"),
    ("ITL P99 (ms)", "itl_p99_s", 1e3, "{:.0f}"),
    ("TTFT attainment", "ttft_attainment", 100.0, "{:.1f}%"),
    ("SLO attainment", "attainment", 100.0, "{:.1f}%"),
    ("goodput (req/s)", "goodput_rps", 1.0, "{:.2f}"),
)
SAME_WORKLOAD = ("requests", "rate_rps", "length_scale", "slo_ttft_ms", "slo_tpot_ms")


def read_run(directory: Path) -> dict:
    """summary.json plus the share of all requests (failed ones included) whose first token met the SLO."""
    summary = json.loads((directory / "summary.json").read_text())
    lines = [json.loads(line) for line in (directory / "requests.jsonl").read_text().splitlines()]
    limit = summary["slo_ttft_ms"] / 1e3
    met = sum(line["ttft_s"] is not None and line["ttft_s"] <= limit for line in lines)
    return summary | {"ttft_attainment": met / len(lines) if lines else 0.0}


def check_same_workload(runs: dict[str, dict]) -> None:
    """Ratios mean nothing unless every system was sent the same requests under the same SLOs."""
    for key in SAME_WORKLOAD:
        values = {name: run[key] for name, run in runs.items()}
        if len(set(values.values())) > 1:
            raise SystemExit(f"the runs differ in {key}: {values}")


def cell(run: dict, key: str, scale: float, fmt: str) -> str:
    value = run.get(key)
    return "n/a" if value is None else fmt.format(value * scale)


def ratio(ours: dict, theirs: dict, key: str) -> str:
    if ours.get(key) is None or not theirs.get(key):
        return "n/a"
    return f"{ours[key] / theirs[key]:.2f}"


def markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = [headers, ["---"] + ["---:"] * (len(headers) - 1), *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def report(runs: dict[str, dict]) -> str:
    baselines = [name for name in runs if name.startswith("vllm")]
    ours = [name for name in runs if name not in baselines]
    first = next(iter(runs.values()))
    head = (f"{first['requests']} requests of trace {first['trace']} at {first['rate_rps']:.2f} req/s, "
            f"lengths x{first['length_scale']:g}, SLO TTFT {first['slo_ttft_ms']:g} ms / "
            f"TPOT {first['slo_tpot_ms']:g} ms")
    values = [[label, *(cell(runs[n], key, scale, fmt) for n in runs)] for label, key, scale, fmt in METRICS]
    pairs = [(o, b) for o in ours for b in baselines]
    ratios = [[label, *(ratio(runs[o], runs[b], key) for o, b in pairs)] for label, key, _, _ in METRICS]
    tables = [head, "", markdown(["metric", *runs], values)]
    if pairs:
        tables += ["", markdown(["ours / vLLM", *(f"{o} / {b}" for o, b in pairs)], ratios)]
    return "\n".join(tables)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, systems = Path(argv[0]), argv[1:]
    runs = {name: read_run(out / name) for name in systems}
    check_same_workload(runs)
    print(report(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
