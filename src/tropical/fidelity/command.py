"""`tropical fidelity`: print and write how close the simulator comes to the real server."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

from tropical.bench.output import write_outputs
from tropical.fidelity.compare import METRICS, Comparison, relative_errors, values
from tropical.fidelity.plots import real_cdfs, real_vs_sim
from tropical.fidelity.run import FidelityConfig, run_study
from tropical.fidelity.twin import ServerShape
from tropical.report.tables import render

SHORT = {"ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90", "tpot_p50_s": "TPOT p50",
         "tpot_p90_s": "TPOT p90", "attainment": "attainment"}


def add_fidelity_options(parser: argparse.ArgumentParser) -> None:
    d = FidelityConfig(profile="", shape=ServerShape(16384, 16, 1024, 2048))
    parser.add_argument("--model", default=d.model)
    parser.add_argument("--profile", help="the engine's latency profile (default: measure one now)")
    parser.add_argument("--profile-grid", default="medium", choices=["quick", "medium", "full"],
                        help="grid of the profile measured when --profile is not given")
    parser.add_argument("--policies", default=",".join(d.policies))
    parser.add_argument("--trace", default=d.trace)
    parser.add_argument("--limit", type=int, default=d.limit)
    parser.add_argument("--rate-scale", type=float, default=d.rate_scale)
    parser.add_argument("--length-scale", type=float, default=d.length_scale)
    parser.add_argument("--slo-ttft-ms", type=float, default=d.slo_ttft_ms)
    parser.add_argument("--slo-tpot-ms", type=float, default=d.slo_tpot_ms)
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads per worker")
    parser.add_argument("--workers", help="as tropical serve --workers (default: the policy's)")
    parser.add_argument("--kv-tokens", type=int, default=d.shape.kv_tokens)
    parser.add_argument("--max-model-len", type=int, default=d.shape.max_model_len)
    parser.add_argument("--max-batched-tokens", type=int, default=d.shape.max_batched_tokens)
    parser.add_argument("--out", default="out/fidelity")
    parser.add_argument("--json", action="store_true")


def fidelity_main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = ServerShape(args.kv_tokens, 16, args.max_model_len, args.max_batched_tokens, args.workers)
    cfg = FidelityConfig(args.profile or "", shape, args.model, args.threads,
                         tuple(p.strip() for p in args.policies.split(",") if p.strip()), args.trace,
                         args.limit, args.rate_scale, args.length_scale, args.slo_ttft_ms, args.slo_tpot_ms)
    if not args.profile:
        profile = measure_profile(args.model, args.threads, args.profile_grid, out / "profile.json")
        cfg = replace(cfg, profile=str(profile))
    pairs = run_study(cfg, out / "logs", progress=lambda m: print(m, file=sys.stderr, flush=True))
    results = [comparison for comparison, _ in pairs]
    for comparison, run in pairs:
        write_outputs(run, out / comparison.policy)
    real_vs_sim(results, out / "real_vs_sim.png")
    real_cdfs([run for _, run in pairs], [c.policy for c in results], out / "real_latency_cdfs.png")
    settings = {k: v for k, v in vars(args).items() if k != "func"}
    document = {"config": settings, "results": [r.as_dict() for r in results]}
    (out / "fidelity.json").write_text(json.dumps(document, indent=2) + "\n")
    (out / "fidelity.md").write_text(fidelity_table(results) + "\n")
    if args.json:
        print(json.dumps([r.as_dict() for r in results]))
    else:
        print(fidelity_table(results))
        print(f"wrote {out / 'fidelity.md'} and {out / 'fidelity.json'}")
    return 0


def measure_profile(model: str, threads: int, grid: str, path: Path) -> Path:
    """The engine's profile at the workers' thread count."""
    import torch

    from tropical.engine.profiler import GRIDS, profile_model, write_profile

    torch.set_num_threads(threads)
    write_profile(profile_model(model, GRIDS[grid]), path)
    return path


def fidelity_table(results: list[Comparison]) -> str:
    """real / simulated (error; error on the bare profile) per metric and policy."""
    headers = ["policy", *(f"{SHORT[m]} real / sim (err; bare)" for m in METRICS), "real goodput (req/s)"]
    rows = []
    for r in results:
        real, sim = values(r.real), values(r.adjusted)
        err, bare = relative_errors(r.real, r.adjusted), relative_errors(r.real, r.profile_only)
        rows.append([r.policy, *(f"{_fmt(real[m], m)} / {_fmt(sim[m], m)} ({_pct(err[m])}; {_pct(bare[m])})"
                                 for m in METRICS), f"{r.goodput_rps:.3f}"])
    return render(headers, rows)


def _fmt(value: float, metric: str) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.1%}" if metric == "attainment" else f"{value * 1e3:.0f}ms"


def _pct(error: float) -> str:
    return "-" if math.isnan(error) else f"{error:+.0%}"
