"""`tropical fidelity`'s flags, apart from the command so that building the CLI's parser loads
neither the study nor its plots."""

from __future__ import annotations

import argparse

from tropical.fidelity.host import TOLERANCE
from tropical.fidelity.run import FidelityConfig


def add_fidelity_options(parser: argparse.ArgumentParser) -> None:
    d = FidelityConfig(profile="")
    parser.add_argument("--model", default=d.model)
    parser.add_argument("--profile", help="the engine's latency profile (default: measure one now)")
    parser.add_argument("--profile-grid", default="medium", choices=["quick", "medium", "full"],
                        help="grid of the profile measured when --profile is not given")
    parser.add_argument("--policies", default=",".join(d.policies))
    parser.add_argument("--trace", default=d.trace)
    parser.add_argument("--limit", type=int, default=d.limit, help="requests per policy and repeat")
    parser.add_argument("--repeats", type=int, default=d.repeats,
                        help="live runs per policy; real numbers are reported as mean (min..max) over them")
    parser.add_argument("--rate-scale", type=float, default=d.rate_scale)
    parser.add_argument("--length-scale", type=float, default=d.length_scale)
    parser.add_argument("--max-input", type=int, help="cut prompts to this many tokens after the length "
                        "scale (they keep the trace's shared prefix blocks, which a length scale drops)")
    parser.add_argument("--max-output", type=int, help="cut outputs to this many tokens")
    parser.add_argument("--slo-ttft-ms", type=float, default=d.slo_ttft_ms)
    parser.add_argument("--slo-tpot-ms", type=float, default=d.slo_tpot_ms)
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads per worker")
    parser.add_argument("--workers", help="as tropical serve --workers (default: the policy's)")
    parser.add_argument("--kv-tokens", type=int, default=d.shape.kv_tokens)
    parser.add_argument("--max-model-len", type=int, default=d.shape.max_model_len)
    parser.add_argument("--max-batched-tokens", type=int, default=d.shape.max_batched_tokens)
    parser.add_argument("--prefix-cache", default="on" if d.shape.prefix_cache else "off",
                        choices=["on", "off"],
                        help="the servers' prefix cache (tropical serve --prefix-cache); the twin models it "
                             "and predicts its hit rate")
    parser.add_argument("--host-check", default="warn", choices=["warn", "match", "skip"],
                        help="with --profile, time the engine on this host first (under a minute) and "
                             f"compare with the profile: warn when it is more than {TOLERANCE}x off, or "
                             "match the load to it (rate / ratio, SLOs and the profile's times x ratio), "
                             "or skip it")
    parser.add_argument("--out", default="out/fidelity")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--replay", metavar="DIR",
                        help="price the study recorded in DIR again, without a server (its study.json and "
                             "each finished run's outputs and iteration log, so a study cut short too); "
                             "rewrites DIR's fidelity.md, fidelity.json and real_vs_sim.png")
