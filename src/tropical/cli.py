"""The ``tropical`` command: the only place that wires the layers together."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from tropical.config import PRESETS, SimConfig, read_config_file
from tropical.report.tables import capacity_table, summary_table


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _add_sim_options(parser: argparse.ArgumentParser) -> None:
    """One flag per SimConfig field; unset flags fall back to the config file and preset."""
    for f in fields(SimConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float, "bool": _parse_bool}.get(str(f.type).split(" ")[0], str)
        helps = {"cluster": f"preset: {', '.join(PRESETS)}",
                 "profile": "fitted latency profile JSON (default: calibrated roofline)",
                 "rate_scale": "multiply the trace's request rate",
                 "limit": "first N requests of the trace"}
        parser.add_argument(flag, type=kind, default=None, help=helps.get(f.name))
    parser.add_argument("--config", help="TOML or JSON file of the settings above")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _config(args: argparse.Namespace) -> SimConfig:
    explicit = {f.name: getattr(args, f.name) for f in fields(SimConfig)
                if getattr(args, f.name, None) is not None}
    cfg = SimConfig(cluster=explicit.get("cluster", "paper")).with_preset()
    if args.config:
        cfg = cfg.updated(read_config_file(args.config), args.config)
    return cfg.updated(explicit, "command line")


def cmd_sim(args: argparse.Namespace) -> int:
    from tropical.sim.build import experiment
    from tropical.sim.run import simulate

    result = simulate(experiment(_config(args)))
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(summary_table(result))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from tropical.sim.build import experiment
    from tropical.sim.sweep import sweep

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    exp = experiment(_config(args))
    found = sweep(exp, policies, target=args.target, rel_tol=args.tol, jobs=args.jobs,
                  show_progress=not args.json)
    if args.json:
        print(json.dumps({"capacity_rps": {p: c.capacity_rps for p, c in found.items()},
                          "rate_scale": {p: c.result.rate_scale for p, c in found.items()},
                          "target": args.target, "rel_tol": args.tol, "trace": exp.trace.name,
                          "requests": len(exp.trace)}))
    else:
        print(capacity_table(found, args.target))
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from tropical.report.markdown import write_report
    from tropical.report.plots import write_all
    from tropical.sim.build import experiment, trace_slice
    from tropical.sim.reproduce import reproduce

    cfg = _config(args)
    rep = reproduce(experiment(cfg), lambda name: trace_slice(cfg, name, args.sensitivity_limit),
                    processes=args.jobs, sensitivity=not args.no_sensitivity, progress=not args.json)
    out = Path(args.out)
    write_all(rep, out)
    report = write_report(rep, out)
    (out / "reproduction.json").write_text(json.dumps(rep.as_dict(), indent=2))
    if args.json:
        print(json.dumps({"capacity_rps": rep.as_dict()["capacity_rps"],
                          "ratio_vs_best_baseline": rep.ratio_vs_best_baseline(),
                          "report": str(report)}))
    else:
        print(capacity_table(rep.capacity, 0.9))
        print(f"report: {report}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from tropical.calibration.command import calibrate_main

    result = calibrate_main(Path(args.vidur), Path(args.out) if args.out else None,
                            report=not args.json)
    if args.json:
        print(json.dumps(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tropical", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("sim", help="simulate a trace on a cluster under one policy")
    _add_sim_options(sim)
    sim.set_defaults(func=cmd_sim)
    sweep = sub.add_parser("sweep", help="goodput capacity of several policies (bisection)")
    _add_sim_options(sweep)
    sweep.add_argument("--policies", default="colocated,chunked,disagg")
    sweep.add_argument("--target", type=float, default=0.9, help="SLO attainment to hold")
    sweep.add_argument("--tol", type=float, default=0.02, help="relative tolerance of the rate")
    sweep.add_argument("--jobs", type=int, default=2, help="policies searched in parallel")
    sweep.set_defaults(func=cmd_sweep)
    rep = sub.add_parser("reproduce", help="the paper's evaluation: capacities, latencies, plots, report")
    _add_sim_options(rep)
    rep.add_argument("--out", default="out/reproduce", help="directory for report.md and plots")
    rep.add_argument("--jobs", type=int, default=2, help="simulations in parallel")
    rep.add_argument("--sensitivity-limit", type=int, default=3000,
                     help="requests of each trace used by the sensitivity studies")
    rep.add_argument("--no-sensitivity", action="store_true", help="skip the sensitivity studies")
    rep.set_defaults(func=cmd_reproduce)
    cal = sub.add_parser("calibrate", help="fit the roofline model to Vidur's measured profiles")
    cal.add_argument("--vidur", default="../shared/data/profiles/vidur")
    cal.add_argument("--out", help="directory for the calibrated JSON files")
    cal.add_argument("--json", action="store_true")
    cal.set_defaults(func=cmd_calibrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as err:
        print(f"tropical: error: {err}", file=sys.stderr)
        return 2

