"""The prefix cache's effect with the machine's speed held fixed: each run of a recorded fidelity
study re-priced by its twin with the cache on and off, at that run's own measured speed.

Usage: python benchmarks/prefix_cache_twin.py DIR [--json]

Live runs with the cache on and off run one after another, and on a shared machine their speeds
differ (the study reports each run's compute over the profile's prediction); their twins replay
the very requests the client sent at one run's speed, so P50 TTFT and goodput on over off isolate
what the cache saves. DIR is a study from `tropical fidelity --max-input ...` (its requests.jsonl
name each prompt's prefix blocks).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from tropical.calibration.store import load_profile
from tropical.core.metrics import goodput
from tropical.core.slo import SLO
from tropical.fidelity.overheads import measured_speed
from tropical.fidelity.replay import iteration_log, load_run, study_profile
from tropical.fidelity.twin import ServerShape, simulate_twin
from tropical.serve.iteration_log import read_iterations
from tropical.serve.options import policy_and_roles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = Path(args.study)
    config = json.loads((out / "study.json").read_text())["config"]
    shape = ServerShape(config["kv_tokens"], 16, config["max_model_len"], config["max_batched_tokens"],
                        config["workers"])
    slo = SLO(config["slo_ttft_ms"] / 1e3, config["slo_tpot_ms"] / 1e3)
    profile = load_profile(study_profile(config, out))
    result = {}
    for policy in (p.strip() for p in config["policies"].split(",") if p.strip()):
        adjustment = json.loads((out / policy / "1" / "twin.json").read_text())["adjustment"]
        run = load_run(out / policy / "1", slo)
        workers = len(policy_and_roles(shape.options(policy))[1])
        speeds = measured_speed(profile, read_iterations(iteration_log(out, policy, 1)), workers,
                                adjustment["transfer_scale"])
        both = {}
        for cache in ("on", "off"):
            twin = simulate_twin(run.planned, slo, policy, replace(shape, prefix_cache=cache == "on"), speeds,
                                 adjustment["frontend_s"], profile)
            summary = twin.summary()
            both[cache] = {"ttft_p50_s": summary.ttft.p50, "ttft_p90_s": summary.ttft.p90,
                           "goodput_rps": goodput(twin.requests), "hit_rate": summary.prefix_hit_rate}
        both["p50_ttft_on_over_off"] = both["on"]["ttft_p50_s"] / both["off"]["ttft_p50_s"]
        both["host_over_profile"] = adjustment["profile_ratio"]
        result[policy] = both
    print(json.dumps(result) if args.json else render(result))


def render(result: dict) -> str:
    return "\n".join(
        f"{policy} (host at {r['host_over_profile']:.2f}x the profile): P50 TTFT "
        f"{r['on']['ttft_p50_s']:.2f} s with the cache, {r['off']['ttft_p50_s']:.2f} s without "
        f"({r['p50_ttft_on_over_off']:.2f}x); goodput {r['on']['goodput_rps']:.3f} vs "
        f"{r['off']['goodput_rps']:.3f} req/s; hit rate {r['on']['hit_rate']:.1%}"
        for policy, r in result.items())


if __name__ == "__main__":
    sys.exit(main())
