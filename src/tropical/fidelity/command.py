"""`tropical fidelity`: print and write how close the simulator comes to the real server."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from tropical.bench.output import write_outputs
from tropical.bench.run import BenchRun
from tropical.calibration.store import load_profile
from tropical.fidelity.compare import Comparison, nullable
from tropical.fidelity.host import matched, measure_host, measure_profile
from tropical.fidelity.plots import real_cdfs, real_vs_sim
from tropical.fidelity.repeats import PolicyRepeats, median_abs_error, path_agreement
from tropical.fidelity.replay import HOST_PROFILE, STUDY, TWIN, replay_study
from tropical.fidelity.report import report
from tropical.fidelity.run import FidelityConfig, run_study
from tropical.fidelity.twin import ServerShape


def fidelity_main(args: argparse.Namespace) -> int:
    if args.replay:
        settings, policies = replay_study(Path(args.replay))
        return publish(policies, Path(args.replay), settings, args.json)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = ServerShape(args.kv_tokens, 16, args.max_model_len, args.max_batched_tokens, args.workers,
                        args.prefix_cache == "on")
    cfg = FidelityConfig(args.profile or "", shape, args.model, args.threads,
                         tuple(p.strip() for p in args.policies.split(",") if p.strip()), args.trace,
                         args.limit, args.rate_scale, args.length_scale, args.slo_ttft_ms, args.slo_tpot_ms,
                         repeats=args.repeats, max_input=args.max_input, max_output=args.max_output)
    settings = {k: v for k, v in vars(args).items() if k not in ("func", "replay")}
    if not args.profile:
        cfg = replace(cfg, profile=str(measure_profile(args.model, args.threads, args.profile_grid,
                                                       out / "profile.json")))
    elif args.host_check != "skip":
        cfg, settings = check_host(cfg, settings, args.host_check == "match", out)
    (out / STUDY).write_text(json.dumps({"config": settings}, indent=2) + "\n")

    def keep(policy: str, repeat: int, comparison: Comparison, run: BenchRun) -> None:
        write_outputs(run, out / policy / str(repeat))
        (out / policy / str(repeat) / TWIN).write_text(json.dumps(comparison.as_dict(), indent=2) + "\n")

    study = run_study(cfg, out / "logs", lambda m: print(m, file=sys.stderr, flush=True), keep)
    policies = [repeats for repeats, _ in study]
    real_cdfs([runs[0] for _, runs in study], [p.policy for p in policies], out / "real_latency_cdfs.png")
    return publish(policies, out, settings, args.json)


def publish(policies: list[PolicyRepeats], out: Path, settings: dict[str, Any], as_json: bool) -> int:
    """The study's report, JSON and real-vs-simulated plot in ``out``, and on stdout."""
    real_vs_sim(policies, out / "real_vs_sim.png")
    document = {"config": settings, "median_abs_error": nullable(median_abs_error(policies)),
                "path_agreement": nullable(path_agreement(policies)), "spread": "min..max over the repeats",
                "policies": [p.as_dict() for p in policies]}
    (out / "fidelity.json").write_text(json.dumps(document, indent=2) + "\n")
    text = report(policies, settings.get("host"))
    (out / "fidelity.md").write_text(text + "\n")
    wrote = f"wrote {out / 'fidelity.md'} and {out / 'fidelity.json'}"
    print(json.dumps(document) if as_json else f"{text}\n{wrote}")
    return 0


def check_host(cfg: FidelityConfig, settings: dict[str, Any], match: bool,
               out: Path) -> tuple[FidelityConfig, dict[str, Any]]:
    """Time the engine against the study's profile before any live run; say when this host is far
    from the profile's speed, or, matching, run the study in this host's time units (the settings
    then record what was run, and under ``host.asked`` what was asked)."""
    profile = load_profile(cfg.profile)
    speed = measure_host(cfg.model, cfg.threads, profile)
    print(f"host check: {speed.describe()}", file=sys.stderr, flush=True)
    host: dict[str, Any] = {**speed.as_dict(), "matched": match}
    if match:
        cfg, slowed = matched(cfg, speed, profile)
        path = out / HOST_PROFILE
        path.write_text(json.dumps(slowed.to_dict(), indent=2) + "\n")
        cfg = replace(cfg, profile=str(path))
        ran = {"profile": cfg.profile, "rate_scale": cfg.rate_scale, "slo_ttft_ms": cfg.slo_ttft_ms,
               "slo_tpot_ms": cfg.slo_tpot_ms}
        host["asked"] = {k: settings[k] for k in ran}
        settings = {**settings, **ran}
    elif speed.far:
        print("warning: the study's rate and SLOs are absolute, so on this host its load differs from "
              "that on the profile's and published tables will not come back; --host-check match runs "
              "it in this host's time units", file=sys.stderr, flush=True)
    return cfg, {**settings, "host": host}
