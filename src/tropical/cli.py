"""The ``tropical`` command: the only place that wires the layers together."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tropical.bench.config import add_bench_options
from tropical.config import PRESETS, SimConfig, read_config_file
from tropical.report.tables import capacity_table, render, summary_table
from tropical.sched.slack import SlackRule
from tropical.sched.tropical import SHORTLIST
from tropical.workload.flags import WORKLOAD_HELP
from tropical.workload.trace import Trace

if TYPE_CHECKING:
    import torch

    from tropical.serve.options import ServeOptions


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_fields_as_options(parser: argparse.ArgumentParser, config: type, helps: dict[str, str]) -> None:
    """One flag per field of the ``config`` dataclass (``max_seqs`` → ``--max-seqs``), typed as the
    field is; unset flags stay None, so the dataclass default (or a file, or a preset) applies."""
    kinds: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "bool": _parse_bool}
    for f in fields(config):
        kind = kinds.get(str(f.type).split(" ")[0], str)
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=None, help=helps.get(f.name))


def _set_options(args: argparse.Namespace, config: type) -> dict[str, Any]:
    """The flags of ``config``'s fields that the command line set."""
    return {f.name: getattr(args, f.name) for f in fields(config) if getattr(args, f.name, None) is not None}


POLICY_HELP = {
    "prefill_workers": "prefill workers of a disaggregated policy (default: half)",
    "max_batched_tokens": "tokens per prefill iteration (colocated, disagg, tropical)",
    "chunk_budget": "tokens per iteration under chunked prefill (chunked)",
    "max_seqs": "requests per iteration",
    "watermark": "share of a worker's KV a multiplexed prefill may fill up to (tropical)",
    "slack": f"how Path 2 reads TPOT slack: {' or '.join(r.value for r in SlackRule)} (tropical)",
    "lookahead": "how deep in the queue the toggle looks for TTFT risk (tropical)",
    "demote_doomed": "true: requests that will miss their TTFT even if started now yield their "
                     "place (default: true for tropical+, false for tropical)",
    "burst_multiplex": "true: a prompt the prefill workers cannot clear within its TTFT SLO may "
                       "stretch a multiplexing worker's iteration past the per-iteration TPOT "
                       "limit, spending the slack its decodes banked (tropical)",
    "prefill_batch_tokens": "prompt tokens a prefill worker batches per iteration (default: "
                            "1024 for tropical+, --max-batched-tokens for tropical; a lone prompt "
                            "may exceed it, so a small budget runs prompts one at a time in queue "
                            "order)",
    "spare_finishing": "true: a multiplexing worker's iteration that finishes a prompt takes no "
                       "later prompt, whole or a chunk, that would make the finished one miss its "
                       "TTFT SLO (default: true for tropical+, false for tropical)",
    "shorter_first": "true: an arriving prompt at risk on Path 1 takes Path 2 at once only where no "
                     "shorter prompt at risk waits in the prefill queues; else it queues there and "
                     "the next round offers Path 2 shortest first (default: true for tropical+, "
                     "false for tropical)",
    "iteration_cap": "true: a multiplexing worker's iteration that carries prompt chunks also ends "
                     "within what the tightest TTFT SLO seen leaves once that prompt's own "
                     "iteration is paid, so that an arrival as tight can wait one iteration and "
                     "still meet it (default: true for tropical+, false for tropical)",
    "joining_decodes": "true: Path 2 prices a multiplexing worker's prompt chunks beside the decodes "
                       "that the prompts queued there become once prefilled, not only beside its "
                       "decode batch as it stands (default: true for tropical+, false for tropical)",
    "placed_dispatch": "true: Path 1 sends a prompt to the prefill worker where it would finish "
                       "soonest at its place in the queue's order (under laxity order, behind only "
                       "the prompts with a lower queue key) instead of by --least-loaded's rule (default: "
                       "true for tropical+, false for tropical)",
    "shortlist": f"multiplexing workers Path 2 prices per request where there are more (the least "
                 f"loaded of those holding the prompt's prefix, then the least loaded; tropical; "
                 f"default {SHORTLIST})",
    "chunked_multiplex": "true: multiplexing workers take prompts in chunks sized to each iteration's "
                         "TPOT slack (tropical)",
    "laxity": "true: prefill queues ordered by urgency (see --size-weight) instead of arrival; "
              "under chunked multiplexing the multiplexing workers' queues too (tropical)",
    "size_weight": "under laxity order, a prompt's queue key is its TTFT deadline plus this times "
                   "its predicted prefill: -1 orders by latest feasible start (the paper's), 0 by "
                   "deadline, above 0 shorter prompts first among near deadlines (default: 2 for "
                   "tropical+, -1 for tropical)",
    "prefill_piece_tokens": "a prefill worker cuts a prompt longer than its batch budget into pieces of "
                            "at most this many tokens and, under laxity order, queues the rest again by "
                            "its key after each piece, so an urgent prompt waits for one piece, not the "
                            "whole prompt (0: whole prompts; default: 4096 for tropical+, 0 for tropical)",
    "least_loaded": "true: Path 1 picks the prefill worker with the fewest unfinished tokens (the "
                    "baselines' dispatch) instead of the earliest predicted finish (tropical)",
    "correct_predictions": "true: each worker's latency predictions are corrected online by the "
                           "ratio of observed to predicted iteration times (tropical)",
    "kv_overlap_weight": "weight of the prompt blocks a worker would prefill against its active "
                         "blocks in the KV router's cost (kv-router*; default 64, tuned; "
                         "Dynamo's default is 1)",
    "roles_both_ways": "true: an idle prefill worker lends itself to decoding and multiplexing "
                       "while another prefill worker idles too, and drains back when Path 1 prompts "
                       "are at risk (tropical)",
    "admission": "which requests to refuse before any work (every policy): none; early-reject "
                 "(its predicted TTFT misses the SLO, at arrival or while still queued); predictive "
                 "(also the decode load predicted for its prefill's end breaks its TPOT SLO on "
                 "average, or its TBT SLO in one iteration)",
}

TBT_SCALE_HELP = "TBT SLO (longest gap between two tokens) = this x the TPOT SLO"


def _add_sim_options(parser: argparse.ArgumentParser) -> None:
    """One flag per SimConfig field; unset flags fall back to the config file and preset."""
    helps = {**POLICY_HELP, "cluster": f"preset: {', '.join(PRESETS)}",
             "profile": "fitted latency profile JSON (default: calibrated roofline)",
             "rate_scale": "multiply the trace's request rate",
             "limit": "first N requests of the trace",
             "prefix_cache": "on (default, as vLLM): each worker reuses the prompt prefixes it "
                             "computed (the trace's hash_ids); off: every prompt is computed whole",
             "host_kv": "host memory for each worker's prefix cache, as a multiple of its KV pool "
                        "(0, the default: none; 10: blocks evicted from the pool stay in ten times as "
                        "much host memory and load back over PCIe, as LMCache or vLLM's CPU offloading)",
             "host_tier": "per-worker (default): each worker's host memory holds what its own pool "
                          "evicted; shared: one store of all of it that every worker loads from "
                          "(Mooncake's store)",
             "tbt_scale": TBT_SCALE_HELP,
             "predictor_bias": "systematic relative error of every prediction, e.g. -0.2: the "
                               "policy expects iterations 20%% faster than they run",
             **WORKLOAD_HELP}
    add_fields_as_options(parser, SimConfig, helps)
    parser.add_argument("--config", help="TOML or JSON file of the settings above")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _config(args: argparse.Namespace) -> SimConfig:
    explicit = _set_options(args, SimConfig)
    cfg = SimConfig(cluster=explicit.get("cluster", "paper")).with_preset()
    if args.config:
        cfg = cfg.updated(read_config_file(args.config), args.config)
    return cfg.updated(explicit, "command line")


def cmd_sim(args: argparse.Namespace) -> int:
    from tropical.sim.build import experiment
    from tropical.sim.collection import left_to_exit
    from tropical.sim.run import simulate

    result = simulate(experiment(_config(args)))
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(summary_table(result))
    left_to_exit()
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from tropical.sim.build import experiment
    from tropical.sim.pooled_bound import PooledCluster
    from tropical.sim.sweep import sweep

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    exp = experiment(_config(args))
    found = sweep(exp, policies, target=args.target, rel_tol=args.tol, jobs=args.jobs,
                  show_progress=not args.json)
    cluster = PooledCluster.of(exp)
    bound, pooled = cluster.bound.rate_rps, cluster.capacity(args.target, args.tol)
    if args.json:
        print(json.dumps({"capacity_rps": {p: c.capacity_rps for p, c in found.items()},
                          "stream_capacity_rps": {p: c.stream_capacity_rps for p, c in found.items()},
                          "rate_scale": {p: c.result.rate_scale for p, c in found.items()},
                          "bound_rps": bound, "pooled_bound_rps": pooled, "target": args.target,
                          "rel_tol": args.tol,
                          "trace": exp.trace.name, "requests": len(exp.trace)}))
    else:
        print(capacity_table(found, args.target))
        print(f"work bound: {bound:.3f} req/s (no policy serves this trace faster without "
              "deferring work past its end)")
        print(f"pooled bound: {pooled:.3f} req/s (an ideal pooled cluster with the trace's bursts "
              f"kept: {args.target:.0%} of requests within their TTFT SLO)")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from tropical.report.markdown import write_report
    from tropical.report.plots import write_all
    from tropical.sim.build import experiment, trace_slice
    from tropical.sim.reproduce import reproduce

    cfg = _config(args)
    exp = experiment(cfg)

    def slice_of(name: str) -> Trace:
        """Studies name traces as loaded; a file trace's name is its stem, so map it to its path."""
        return trace_slice(cfg, cfg.trace if name == exp.trace.name else name, args.sensitivity_limit)

    rep = reproduce(exp, slice_of, processes=args.jobs, sensitivity=not args.no_sensitivity,
                    progress=not args.json)
    out = Path(args.out)
    write_all(rep, out)
    report = write_report(rep, out)
    (out / "reproduction.json").write_text(json.dumps(rep.as_dict(), indent=2))
    if args.json:
        print(json.dumps({**rep.headline(), "report": str(report)}))
    else:
        print(capacity_table(rep.capacity, 0.9))
        print(f"report: {report}")
    return 0


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if name not in dtypes:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(dtypes)}")
    return dtypes[name]


def cmd_generate(args: argparse.Namespace) -> int:
    from tropical.core.sampling import SamplingParams
    from tropical.engine.generate import generate
    from tropical.engine.loader import load_model

    loaded = load_model(args.model, dtype=_torch_dtype(args.dtype), device=args.device)
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    result = generate(loaded, args.prompt, args.max_tokens, sampling, args.stop or None,
                      chat=False if args.no_chat else None)
    print(result.text)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from tropical.engine.profiler import GRIDS, profile_model, write_profile

    if args.server:
        import asyncio

        from tropical.serve.vllm.profile import measure_server

        result = asyncio.run(measure_server(args.server, args.grid, args.model, args.dtype))
    else:
        result = profile_model(args.model, GRIDS[args.grid], _torch_dtype(args.dtype), args.device)
    out = Path(args.out or f"out/profile-{'server' if args.server else Path(args.model).stem}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_profile(result, out)
    rows = [[kind, f"{e.median_pct:.1f}", f"{e.max_pct:.1f}"] for kind, e in result.errors.items()]
    print(render(["iterations", "median error %", "max error %"], rows))
    source = args.server or args.model
    print(f"latency profile of {source}: {out} (use it with: tropical sim --profile {out})")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from tropical.calibration.command import calibrate_main

    result = calibrate_main(Path(args.vidur), Path(args.out) if args.out else None,
                            report=not args.json)
    if args.json:
        print(json.dumps(result))
    return 0


def cmd_fidelity(args: argparse.Namespace) -> int:
    from tropical.fidelity.command import fidelity_main

    return fidelity_main(args)


def cmd_export(args: argparse.Namespace) -> int:
    from tropical.engine.export import save_hf_dir
    from tropical.engine.loader import load_model

    out = save_hf_dir(load_model(args.model, dtype=_torch_dtype(args.dtype), device=args.device), args.out)
    print(f"wrote {out} (serve it with: tropical serve --model {out})")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from tropical.bench.command import bench_main

    return bench_main(args)


def cmd_native(args: argparse.Namespace) -> int:
    from tropical import native

    if args.action == "build":
        print(f"building {len(native.modules())} modules with mypyc (a minute or two)...", file=sys.stderr)
        try:
            native.build()
        except native.BuildError as err:
            print(f"tropical: error: {err}", file=sys.stderr)
            return 2
    print(native.status().describe())
    return 0


def serve_options(args: argparse.Namespace) -> ServeOptions:
    """The server's settings from its flags (each a field of ServeOptions; unset ones default)."""
    from tropical.serve.options import ServeOptions

    return ServeOptions(**_set_options(args, ServeOptions))


def cmd_serve(args: argparse.Namespace) -> int:
    from tropical.serve.server import serve

    serve(serve_options(args))
    return 0


def _add_serve_options(parser: argparse.ArgumentParser) -> None:
    from tropical.sched.registry import policy_names
    from tropical.serve.options import BACKENDS, ENGINES, ServeOptions

    d = ServeOptions()
    helps = {
        **POLICY_HELP,
        "policy": f"{', '.join(policy_names())} (default {d.policy})",
        "max_batched_tokens": f"{POLICY_HELP['max_batched_tokens']} (default {d.max_batched_tokens})",
        "model": "smollm2, tiny-random, a Hugging Face directory or a .gguf file",
        "workers": "a count, or roles such as prefill,multiplex (default: 1 prefill + 1 multiplexing "
                   "for tropical, 2 colocated for colocated/chunked); with --backend ray a role may "
                   "be pinned: prefill@node:10.0.0.5,multiplex@gpu",
        "threads": "torch threads per worker",
        "profile": "latency profile JSON (default: measure quickly at start-up)",
        "api_key": "require 'Authorization: Bearer KEY' (ps shows it: prefer --api-key-file or "
                   "$TROPICAL_API_KEY / $VLLM_API_KEY)",
        "api_key_file": "read the API key from the first line of this file",
        "max_body_mb": f"larger request bodies get 413 before they are read (default {d.max_body_mb})",
        "slo_ttft_ms": "default TTFT SLO (else --slo-scale x light load)",
        "slo_tpot_ms": "default TPOT SLO (else --slo-scale x light load)",
        "tbt_scale": TBT_SCALE_HELP,
        "kv_tokens": "KV cache tokens per worker",
        "max_model_len": "context cap",
        "max_waiting": "queued requests before answering 429",
        "dtype": "float32 or bfloat16",
        "device": "cpu or cuda",
        "served_model_name": "the model id clients use (default: the model's name)",
        "backend": f"{' or '.join(BACKENDS)}: workers as local processes, or as Ray actors (see docs/ray.md)",
        "ray_address": "join this Ray cluster, e.g. HEAD:6379 (default: start a private Ray instance here)",
        "ray_max_restarts": "times Ray restarts a dead worker actor (-1: always)",
        "engine": f"{', '.join(ENGINES)}: our engine, vLLM servers as workers (docs/vllm.md), or mock "
                  "workers that sleep a profile's iteration times (no model; for load-testing the router)",
        "mock_cluster": "the simulator cluster preset a mock worker pretends to be one replica of "
                        f"(default {d.mock_cluster}: InternLM2-20B on 2x A100-80GB); its KV capacity "
                        "replaces --kv-tokens",
        "mock_time_scale": "mock workers sleep their predicted iteration times times this (0.1: ten "
                           "times faster; SLOs scale alike)",
        "worker_urls": "attach to running vLLM servers: prefill=URL,multiplex=URL,...",
        "vllm_python": "Python of the vLLM environment",
        "vllm_out": "folder for the vLLM instances' logs",
        "nixl_poll_delay_us": "CPU only, opt-in: let NIXL's progress thread sleep this long between polls "
                              "(it spins a core otherwise; docs/vllm.md)",
        "prefix_cache": "on (default, as vLLM): each worker reuses the KV of prompt prefixes it computed "
                        "(usage.prompt_tokens_details.cached_tokens says how much); off: every prompt "
                        "is computed whole",
        "max_logprobs": f"most logprobs alternatives a request may ask for per token, as vLLM's "
                        f"(default {d.max_logprobs})",
        "max_n": f"most choices (n) per request (default {d.max_n})",
        "logprobs_mode": "raw_logprobs (default, as vLLM): logprobs of the model's own logits; "
                         "processed_logprobs: after temperature, penalties and logit_bias",
        "iteration_log": "write every iteration (worker, batch shape, wall, compute and predicted "
                         "seconds) to this file as JSON lines; tropical fidelity prices its twin by them",
    }
    add_fields_as_options(parser, ServeOptions, helps)


def _add_fidelity_options(parser: argparse.ArgumentParser) -> None:
    from tropical.fidelity.options import add_fidelity_options

    add_fidelity_options(parser)


def _add_model_options(parser: argparse.ArgumentParser, default: str = "smollm2") -> None:
    parser.add_argument("--model", default=default,
                        help="smollm2, tiny-random, a Hugging Face directory or a .gguf file")
    parser.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")


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
    gen = sub.add_parser("generate", help="complete a prompt with a model on this machine")
    _add_model_options(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--no-chat", action="store_true", help="send the prompt without the chat template")
    gen.set_defaults(func=cmd_generate)
    fid = sub.add_parser("fidelity", help="the same trace slice through the real server and the simulator")
    _add_fidelity_options(fid)
    fid.set_defaults(func=cmd_fidelity)
    srv = sub.add_parser("serve", help="serve a model over an OpenAI-compatible API with a policy")
    _add_serve_options(srv)
    srv.set_defaults(func=cmd_serve)
    prof = sub.add_parser("profile", help="measure this engine into a latency profile for sim and the toggle")
    _add_model_options(prof, default="tiny-random")
    prof.add_argument("--out", help="profile JSON (default out/profile-<model>.json)")
    prof.add_argument("--server", help="measure a running vLLM/OpenAI server at this URL over HTTP instead")
    prof.add_argument("--grid", default="quick", choices=["quick", "medium", "full"],
                      help="points to measure: quick (seconds), medium (prompts to 768 tokens, a minute or "
                           "two), full (to 4k tokens; tens of GB of KV for larger models)")
    prof.set_defaults(func=cmd_profile)
    cal = sub.add_parser("calibrate", help="fit the roofline model to Vidur's measured profiles")
    cal.add_argument("--vidur", default="../shared/data/profiles/vidur")
    cal.add_argument("--out", help="directory for the calibrated JSON files")
    cal.add_argument("--json", action="store_true")
    cal.set_defaults(func=cmd_calibrate)
    bench = sub.add_parser("bench", help="replay a trace against an OpenAI-compatible server, measure SLOs")
    add_bench_options(bench)
    bench.set_defaults(func=cmd_bench)
    exp = sub.add_parser("export", help="write a model as a Hugging Face directory (vLLM, transformers)")
    _add_model_options(exp)
    exp.add_argument("--out", required=True, help="directory to write")
    exp.set_defaults(func=cmd_export)
    nat = sub.add_parser("native", help="compile the simulator with mypyc, or say whether it runs")
    nat.add_argument("action", choices=["build", "status"])
    nat.set_defaults(func=cmd_native)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as err:
        print(f"tropical: error: {err}", file=sys.stderr)
        return 2

