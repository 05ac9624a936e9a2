"""Why the twin and the live server differ, measured on a recorded fidelity study (issue 15).

Reads a study's outputs (``tropical fidelity --out DIR``: fidelity.json, per-run requests.jsonl,
the servers' iteration logs) and prints, as markdown:

1. the profile's error by kind of iteration: live compute time over the profile's prediction,
   summed (what queues feel) and as the median iteration, per policy;
2. the serving overhead per iteration (router wall time minus worker compute), the scale that
   makes each worker's refitted iterations sum to their live compute time, and the front end;
3. the study priced again with each way of timing the twin's iterations, from the earlier one
   (one compute scale on the profile) to the study's (the profile refitted to the run's
   iterations, scaled per worker to their live sum), with the median absolute error, the numbers
   within 20% and the path agreement each gives;
4. each KV migration's phases, where the servers logged them: the export on the source, the wait
   for the target's iteration boundary, and the import there.

    PYTHONPATH=src .venv/bin/python benchmarks/fidelity_causes.py docs/fidelity/win
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

from tropical.calibration.store import load_profile
from tropical.core.latency.adjusted import AdjustedModel
from tropical.core.latency.fitted import FittedModel
from tropical.core.latency.model import LatencyModel
from tropical.core.slo import SLO
from tropical.fidelity.compare import METRICS
from tropical.fidelity.overheads import iteration_kind, measured_speed
from tropical.fidelity.repeats import PolicyRepeats, median_abs_error, path_agreement
from tropical.fidelity.replay import iteration_log, load_run
from tropical.fidelity.report import markdown_table
from tropical.fidelity.run import price_run
from tropical.fidelity.twin import ServerShape
from tropical.serve.iteration_log import IterationRecord, read_iterations, read_migrations
from tropical.serve.options import policy_and_roles

KINDS = ("decode", "mixed", "prefill")
Speeds = Callable[[FittedModel, list[IterationRecord], int, float], list[LatencyModel]]
"""Each worker's model for a run: the profile, the run's iterations, the worker count and the
run's measured KV transfer scale."""


def one_scale(profile: FittedModel, records: list[IterationRecord], workers: int,
              transfer: float) -> list[LatencyModel]:
    """The earlier twin: the profile times the run's compute / predicted, plus the mean overhead."""
    scale = sum(r.compute for r in records) / sum(r.predicted for r in records)
    overhead = statistics.fmean(r.wall - r.compute for r in records)
    return [AdjustedModel(profile, scale, max(0.0, overhead), transfer)] * workers


def refit_only(profile: FittedModel, records: list[IterationRecord], workers: int,
               transfer: float) -> list[LatencyModel]:
    """The refit without the per-worker sums: every worker at the typical iteration's speed."""
    return [AdjustedModel(s.base, 1.0, s.overhead, s.transfer_scale)
            for s in measured_speed(profile, records, workers, transfer)]


VARIANTS: dict[str, Speeds] = {"one compute scale on the profile (earlier twin)": one_scale,
                               "profile refitted to the run's iterations": refit_only,
                               "refit, scaled per worker to its live sum (the study's twin)": measured_speed}


def profile_error(runs: dict[str, list[list[IterationRecord]]], profile: FittedModel) -> str:
    rows = []
    for policy, logs in runs.items():
        records = [r for log in logs for r in log]
        for k in KINDS:
            mine = [r for r in records if iteration_kind(r.shape) == k]
            if mine:
                summed = sum(r.compute for r in mine) / sum(profile.iteration_time(r.shape) for r in mine)
                typical = statistics.median(r.compute / profile.iteration_time(r.shape) for r in mine)
                rows.append([policy, k, str(len(mine)), f"{summed:.2f}", f"{typical:.2f}"])
    return markdown_table(["policy", "iterations", "count", "live / profile, summed", "median"], rows)


def overheads(runs: dict[str, list[list[IterationRecord]]], document: dict) -> str:
    rows = []
    for entry in document["policies"]:
        records = [r for log in runs[entry["policy"]] for r in log]
        by_worker = sorted({r.worker for r in records})
        per = [statistics.fmean(r.wall - r.compute for r in records if r.worker == w) for w in by_worker]
        front = [run["adjustment"]["frontend_s"] * 1e3 for run in entry["runs"]]
        scales = list(zip(*(run["adjustment"]["compute_scale"] for run in entry["runs"]), strict=True))
        rows.append([entry["policy"], " / ".join(f"{x * 1e3:.1f}" for x in per),
                     " / ".join(f"{min(w):.2f}..{max(w):.2f}" for w in scales),
                     f"{min(front):.1f}..{max(front):.1f}"])
    return markdown_table(["policy", "wall - compute per iteration, ms (by worker)",
                           "refit's scale to the live sum (by worker, over repeats)", "front end, ms"], rows)


def variants(out: Path, document: dict, runs: dict[str, list[list[IterationRecord]]],
             profile: FittedModel) -> str:
    config = document["config"]
    shape = ServerShape(config["kv_tokens"], 16, config["max_model_len"], config["max_batched_tokens"],
                        config["workers"])
    slo = SLO(config["slo_ttft_ms"] / 1e3, config["slo_tpot_ms"] / 1e3)
    rows = []
    for name, speeds in VARIANTS.items():
        policies = []
        for entry in document["policies"]:
            policy = entry["policy"]
            workers = len(policy_and_roles(shape.options(policy))[1])
            priced = [price_run(load_run(out / policy / str(k), slo), policy, shape, profile,
                                speeds(profile, log, workers, run["adjustment"].get("transfer_scale", 1.0)),
                                run["adjustment"]["frontend_s"])
                      for k, (run, log) in enumerate(zip(entry["runs"], runs[policy], strict=True), 1)]
            policies.append(PolicyRepeats(policy, tuple(priced)))
        errors = [abs(e) for p in policies for m, e in p.errors().items() if m in METRICS]
        within = f"{sum(e <= 0.2 for e in errors)} of {len(errors)}"
        rows.append([name, f"{median_abs_error(policies):.1%}", within, f"{path_agreement(policies):.1%}"])
    return markdown_table(["twin's iteration times", "median abs error", "within 20%", "paths alike"], rows)


def migrations(out: Path, document: dict) -> str:
    """Per policy, each phase of its logged migrations: P50 / P90 / max in ms."""
    rows = []
    for entry in document["policies"]:
        policy = entry["policy"]
        logs = [iteration_log(out, policy, k) for k in range(1, len(entry["runs"]) + 1)]
        moves = [m for log in logs for m in read_migrations(log)]
        if moves:
            phases = ([m.exported - m.staged for m in moves], [m.landed - m.exported for m in moves],
                      [m.imported - m.landed for m in moves])
            rows.append([policy, str(len(moves)), *(_spread_ms(p) for p in phases)])
    if not rows:
        return "(none logged: the servers of this study predate migration records)"
    return markdown_table(["policy", "migrations", "export, ms", "wait for the target's boundary, ms",
                           "import, ms"], rows)


def _spread_ms(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    return " / ".join(f"{x * 1e3:.0f}" for x in (ordered[len(ordered) // 2], ordered[int(0.9 * len(ordered))],
                                                   ordered[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="a tropical fidelity --out folder")
    out = parser.parse_args().study
    document = json.loads((out / "fidelity.json").read_text())
    profile = load_profile(document["config"]["profile"] or out / "profile.json")
    runs = {e["policy"]: [read_iterations(iteration_log(out, e["policy"], k))
                          for k in range(1, len(e["runs"]) + 1)] for e in document["policies"]}
    print("## The profile's error by kind of iteration\n\n" + profile_error(runs, profile))
    print("\n## Serving overheads\n\n" + overheads(runs, document))
    priced = variants(out, document, runs, profile)
    print("\n## The study priced with each timing of the twin's iterations\n\n" + priced)
    print("\n## KV migrations, phase by phase (P50 / P90 / max)\n\n" + migrations(out, document))


if __name__ == "__main__":
    main()
