"""Each policy's goodput over vLLM beside the twin's prediction for the same run: the fidelity study
over vLLM (benchmarks/vllm_policies.sh writes the runs, then calls this).

Every run (OUT/<policy>/rate-<scale>/run-<k>/) is simulated on a twin of the two instances: the
policy's roles, the instances' KV cache (vLLM's log), the very requests the client sent (its
requests.jsonl: send times, prompt and output tokens), the policy deciding by the profile the
routers were given (OUT/profile.json) and iterations timed by OUT/profile-truth.json where there is
one (the instances measured again after the runs: the speed they ran at, where the routers'
profile was measured on a machine loaded otherwise), else by that same profile. vLLM keeps a
prefix cache (its log's ``enable_prefix_caching=True``, vLLM V1's default) in blocks of 128 tokens
(vLLM's CPU default, ``platforms/cpu.py``), and the same two processes serve every run while the
client sends each request id the same prompt tokens in every run (``bench.prompts``, seeded by
the id): so each run's twin starts with the prompts each instance computed or received in the
runs before it, in the order vllm_policies.sh ran them (repeats, then rates, then policies), as
the requests.jsonl of those runs place them. The table
gives, per policy and rate, the measured goodput as mean (min..max) over the repeats, the twin's
mean, and the twin's error; then the median and largest error over all cells; then, per cell, the
SLO misses and median TPOT on each instance, measured beside the twin. OUT/twin.json holds every
run's pair, its TPOTs by instance and its paths.

Usage: python benchmarks/vllm_policies_twin.py OUT   (SLO_TTFT_MS, SLO_TPOT_MS as for the runs)
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

from tropical.bench.plan import PlannedRequest
from tropical.calibration.store import load_profile
from tropical.core.metrics import goodput, tpot, ttft
from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.fidelity.twin import ServerShape, simulate_twin

ROLES = {"vllm-chunked": ("chunked", "colocated,colocated"), "disagg": ("disagg", "prefill,decode"),
         "tropical": ("tropical", "prefill,multiplex"), "tropical+": ("tropical+", "prefill,multiplex")}
RUN = re.compile(r"rate-(?P<rate>[\d.]+)/run-(?P<repeat>\d+)$")
VLLM_CPU_BLOCK = 128
"""vLLM's KV block on CPU when none is asked for (``platforms/cpu.py``): only whole blocks are cached."""
DECODE_INSTANCE = 1
"""The instance that decodes under a split policy (vllm_policies.sh: prefill=instance 0)."""


def kv_tokens(out: Path) -> int:
    """The KV cache vLLM reported at start-up (its log), in tokens."""
    match = re.search(r"CPU KV cache size: ([\d,]+) tokens", (out / "vllm-0.log").read_text())
    if match is None:
        raise SystemExit(f"no 'CPU KV cache size' line in {out / 'vllm-0.log'}")
    return int(match.group(1).replace(",", ""))


def prefix_caching(out: Path) -> bool:
    """Whether vLLM kept a prefix cache (its engine config line in the log)."""
    match = re.search(r"enable_prefix_caching=(True|False)", (out / "vllm-0.log").read_text())
    if match is None:
        raise SystemExit(f"no 'enable_prefix_caching' in {out / 'vllm-0.log'}")
    return match.group(1) == "True"


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines() if line]


def sent(run: Path) -> list[PlannedRequest]:
    """The requests as the client sent them: when, and with how many prompt and output tokens."""
    return [PlannedRequest(r["id"], r["sent_s"], r["prompt_tokens"],
                           r["completion_tokens"] or r["max_tokens"],
                           tuple(r.get("prefix_blocks", ()))) for r in records(run)]


def holders(name: str, record: dict) -> tuple[int, ...]:
    """The instances that hold a request's prompt once it is done: the one that prefilled it and,
    when its KV was handed off (a split policy, prefilled on instance 0, more than one token),
    the decode instance, which caches the blocks it pulls (vLLM's scheduler caches them when the
    remote KV arrives)."""
    first = int(record["prefill_worker"])
    split = ROLES[name][0] != "chunked"
    handed = split and first != DECODE_INSTANCE and (record["completion_tokens"] or 0) > 1
    return (first, DECODE_INSTANCE) if handed else (first,)


def run_order(run: Path) -> tuple[int, float, int]:
    """Where a run came in vllm_policies.sh's loops: repeats outermost, then rates, then policies."""
    match = RUN.search(run.relative_to(run.parents[2]).as_posix())
    assert match is not None, run
    return int(match["repeat"]), float(match["rate"]), list(ROLES).index(run.parents[1].name)


def warm_starts(runs: list[Path]) -> dict[Path, list[list[PlannedRequest]]]:
    """For each run (in ``run_order``), the prompts each instance had computed or received in the
    runs before it, oldest first (within a run, by send time)."""
    history: list[list[PlannedRequest]] = [[], []]
    warm = {}
    for run in sorted(runs, key=run_order):
        warm[run] = [list(prompts) for prompts in history]
        done = [(r, p) for r, p in zip(records(run), sent(run), strict=True) if r["error"] is None]
        for record, planned in sorted(done, key=lambda pair: pair[1].send_at):
            for instance in holders(run.parents[1].name, record):
                history[instance].append(planned)
    return warm


def pairs(out: Path, slo: SLO) -> list[dict]:
    """Every run's measured goodput and its twin's, with the rate it was replayed at."""
    predictor, shape_kv, cached = load_profile(out / "profile.json"), kv_tokens(out), prefix_caching(out)
    truth = out / "profile-truth.json"
    latency = load_profile(truth) if truth.is_file() else predictor
    runs = [summary.parent for summary in sorted(out.glob("*/rate-*/run-*/summary.json"))
            if summary.parents[2].name in ROLES and RUN.search(str(summary.parent.relative_to(out)))]
    warm = warm_starts(runs) if cached else {}
    rows = []
    for run in runs:
        name, match = run.parents[1].name, RUN.search(str(run.relative_to(out)))
        assert match is not None
        policy, workers = ROLES[name]
        measured = json.loads((run / "summary.json").read_text())
        shape = ServerShape(shape_kv, VLLM_CPU_BLOCK, 2048, 2048, workers, prefix_cache=cached)
        twin = simulate_twin(sent(run), slo, policy, shape, latency, predictor=predictor,
                             warm=warm.get(run, ()))
        rows.append({"policy": name, "rate_scale": float(match["rate"]), "repeat": int(match["repeat"]),
                     "rate_rps": measured["rate_rps"], "measured": measured["goodput_rps"],
                     "twin": goodput(twin.requests), "measured_by_instance": measured_spans(name, run, slo),
                     "twin_by_instance": twin_spans(twin.requests, slo), "paths": measured.get("paths", {}),
                     "twin_paths": dict(Counter(r.path.name.lower() for r in twin.requests))})
    return rows


def by_instance(spans: list[tuple[int, float, int, float]], slo: SLO) -> dict[str, list]:
    """From (prefill instance, TTFT, decode instance, TPOT) per request: TTFT misses by the
    instance that prefilled, TPOT misses and every TPOT (ms) by the instance that decoded."""
    out: dict[str, list] = {"ttft_misses": [0, 0], "tpot_misses": [0, 0], "tpots_ms": [[], []]}
    for first, first_token, decoder, per_token in spans:
        out["ttft_misses"][first] += first_token > slo.ttft
        out["tpot_misses"][decoder] += per_token > slo.tpot
        out["tpots_ms"][decoder].append(round(per_token * 1e3, 1))
    return out


def measured_spans(name: str, run: Path, slo: SLO) -> dict[str, list]:
    """``by_instance`` of the requests the client timed (those that ended without an error)."""
    done = [r for r in records(run) if r["error"] is None]
    return by_instance([(int(r["prefill_worker"]), r["ttft_s"], holders(name, r)[-1], r["tpot_s"])
                        for r in done if r["completion_tokens"] > 1], slo)


def twin_spans(requests: list[Request], slo: SLO) -> dict[str, list]:
    return by_instance([(r.prefill_worker or 0, ttft(r), r.decode_worker or 0, tpot(r))
                        for r in requests if r.output_len > 1 and r.finish is not None], slo)


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


def misses_table(rows: list[dict]) -> str:
    """Per cell, over its repeats: requests of more than one token that missed each SLO, and
    their median TPOT, on instance 0 / instance 1 (where they prefilled for TTFT, where they
    decoded for TPOT), measured beside the twin."""
    lines = ["| policy | rate (req/s) | TTFT misses, measured / twin | TPOT misses, measured / twin | "
             "median TPOT (ms), measured / twin |", "| --- | ---: | --- | --- | --- |"]
    for name, scale in sorted({(r["policy"], r["rate_scale"]) for r in rows},
                              key=lambda cell: (list(ROLES).index(cell[0]), cell[1])):
        runs = [r for r in rows if (r["policy"], r["rate_scale"]) == (name, scale)]
        cols = []
        for key in ("ttft_misses", "tpot_misses"):
            real, twin = ([sum(r[side][key][i] for r in runs) for i in (0, 1)] for side in SIDES)
            cols.append(f"{real[0]}+{real[1]} / {twin[0]}+{twin[1]}")
        real_ms, twin_ms = ([_median([t for r in runs for t in r[side]["tpots_ms"][i]]) for i in (0, 1)]
                            for side in SIDES)
        lines.append(f"| {name} | {statistics.mean(r['rate_rps'] for r in runs):.3f} | {cols[0]} | "
                     f"{cols[1]} | {real_ms[0]}, {real_ms[1]} / {twin_ms[0]}, {twin_ms[1]} |")
    lines.append("\n(a+b: on instance 0 + on instance 1; medians: instance 0, instance 1; - where none "
                 "decoded)")
    return "\n".join(lines)


SIDES = ("measured_by_instance", "twin_by_instance")


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.0f}" if values else "-"


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
    print()
    print(misses_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
