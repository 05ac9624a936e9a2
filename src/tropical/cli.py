"""The ``tropical`` command: the only place that wires the layers together."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from tropical.bench.config import add_bench_options
from tropical.config import PRESETS, SimConfig, read_config_file
from tropical.report.tables import capacity_table, render, summary_table


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
                 "limit": "first N requests of the trace",
                 "tbt_scale": "TBT SLO (longest gap between two tokens) = this x the TPOT SLO"}
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
                          "stream_capacity_rps": {p: c.stream_capacity_rps for p, c in found.items()},
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
        print(json.dumps({**rep.headline(), "report": str(report)}))
    else:
        print(capacity_table(rep.capacity, 0.9))
        print(f"report: {report}")
    return 0


def _torch_dtype(name: str) -> object:
    import torch

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if name not in dtypes:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(dtypes)}")
    return dtypes[name]


def cmd_generate(args: argparse.Namespace) -> int:
    from tropical.engine.generate import generate
    from tropical.engine.loader import load_model
    from tropical.engine.sampling import SamplingParams

    loaded = load_model(args.model, dtype=_torch_dtype(args.dtype), device=args.device)
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    result = generate(loaded, args.prompt, args.max_tokens, sampling, args.stop or None,
                      chat=False if args.no_chat else None)
    print(result.text)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from tropical.engine.profiler import GRIDS, profile_model, write_profile

    result = profile_model(args.model, GRIDS[args.grid], _torch_dtype(args.dtype), args.device)
    out = Path(args.out or f"out/profile-{Path(args.model).stem}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_profile(result, out)
    rows = [[kind, f"{e.median_pct:.1f}", f"{e.max_pct:.1f}"] for kind, e in result.errors.items()]
    print(render(["iterations", "median error %", "max error %"], rows))
    print(f"latency profile of {args.model}: {out} (use it with: tropical sim --profile {out})")
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


def cmd_serve(args: argparse.Namespace) -> int:
    from tropical.serve.options import ServeOptions
    from tropical.serve.server import serve

    names = [f.name for f in fields(ServeOptions)]
    serve(ServeOptions(**{name: getattr(args, name) for name in names}))
    return 0


def _add_serve_options(parser: argparse.ArgumentParser) -> None:
    from tropical.sched.registry import policy_names
    from tropical.serve.options import BACKENDS, ServeOptions

    d = ServeOptions()
    parser.add_argument("--policy", default=d.policy, choices=policy_names())
    parser.add_argument("--workers", default=None,
                        help="a count, or roles such as prefill,multiplex (default: 1 prefill + 1 "
                             "multiplexing for tropical, 2 colocated for colocated/chunked); with "
                             "--backend ray a role may be pinned: prefill@node:10.0.0.5,multiplex@gpu")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads per worker")
    parser.add_argument("--profile", help="latency profile JSON (default: measure quickly at start-up)")
    parser.add_argument("--host", default=d.host)
    parser.add_argument("--port", type=int, default=d.port)
    parser.add_argument("--api-key", help="require 'Authorization: Bearer KEY'")
    parser.add_argument("--slo-ttft-ms", type=float, help="default TTFT SLO (else --slo-scale x light load)")
    parser.add_argument("--slo-tpot-ms", type=float, help="default TPOT SLO (else --slo-scale x light load)")
    parser.add_argument("--slo-scale", type=float, default=d.slo_scale)
    parser.add_argument("--kv-tokens", type=int, default=d.kv_tokens, help="KV cache tokens per worker")
    parser.add_argument("--block-size", type=int, default=d.block_size)
    parser.add_argument("--max-model-len", type=int, default=d.max_model_len, help="context cap")
    parser.add_argument("--max-batched-tokens", type=int, default=d.max_batched_tokens)
    parser.add_argument("--max-waiting", type=int, default=d.max_waiting,
                        help="queued requests before answering 429")
    parser.add_argument("--start-timeout", type=float, default=d.start_timeout)
    parser.add_argument("--drain-timeout", type=float, default=d.drain_timeout)
    parser.add_argument("--served-model-name", help="the model id clients use (default: the model's name)")
    parser.add_argument("--backend", default=d.backend, choices=BACKENDS,
                        help="workers as local processes, or as Ray actors (see docs/ray.md)")
    parser.add_argument("--ray-address", help="join this Ray cluster, e.g. HEAD:6379 (default: start a "
                                              "private Ray instance here)")
    parser.add_argument("--ray-max-restarts", type=int, default=d.ray_max_restarts,
                        help="times Ray restarts a dead worker actor (-1: always)")


def _add_fidelity_options(parser: argparse.ArgumentParser) -> None:
    from tropical.fidelity.command import add_fidelity_options

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
    _add_model_options(srv)
    _add_serve_options(srv)
    srv.set_defaults(func=cmd_serve)
    prof = sub.add_parser("profile", help="measure this engine into a latency profile for sim and the toggle")
    _add_model_options(prof, default="tiny-random")
    prof.add_argument("--out", help="profile JSON (default out/profile-<model>.json)")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as err:
        print(f"tropical: error: {err}", file=sys.stderr)
        return 2

