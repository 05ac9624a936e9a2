"""Prefix caching live: what the engine's cache saves on `tropical serve`, as ratios measured side by
side in one run.

Usage: python benchmarks/prefix_cache_live.py [--model smollm2] [--prompt-tokens 1000] [--prompts 3]
           [--limit 24] [--max-input 1024] [--max-output 8] [--rate 0.08] [--json]

1. Repeat: each of ``--prompts`` distinct prompts of ``--prompt-tokens`` tokens is sent twice (one
   token, greedy) to a server with the cache on; the repeat's time to its token over the first's
   (target <= 0.6).
2. Slice: ``tropical bench`` replays the conversation trace's first ``--limit`` requests (their
   prompts share prefixes where the trace's hash_ids do) against the same server with
   ``--prefix-cache on`` and then ``off``; P50 TTFT on over off (target <= 0.6), goodput both ways,
   and the hit rate (cached prompt tokens, from /metrics, over prompt tokens). Prompts are cut to
   ``--max-input`` tokens, which keeps the prefix blocks they still hold (``--length-scale`` would
   drop every prefix block: scaled prompts no longer match the trace's 512-token blocks).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tropical.serve.process import TROPICAL, ServerProcess

SERVE = ["--policy", "colocated", "--workers", "1", "--max-model-len", "4096"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--limit", type=int, default=24)
    parser.add_argument("--max-input", type=int, default=1024)
    parser.add_argument("--max-output", type=int, default=8)
    parser.add_argument("--rate", type=float, default=0.08)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="prefix-cache-live-"))
    result = {"repeat": repeat(args, out),
              "slice": {cache: replay(args, out, cache) for cache in ("on", "off")}}
    on, off = result["slice"]["on"], result["slice"]["off"]
    result["p50_ttft_on_over_off"] = on["ttft_p50_s"] / off["ttft_p50_s"]
    print(json.dumps(result) if args.json else render(result))


def repeat(args: argparse.Namespace, out: Path) -> dict:
    """Seconds to the one token of each prompt, cold and repeated, and their median ratio."""
    firsts, repeats = [], []
    with running(args.model, out / "repeat.log", []) as server:
        for i in range(args.prompts):
            prompt = [100 + (i * 7919 + j * 104729) % 20000 for j in range(args.prompt_tokens)]
            firsts.append(one_token_seconds(server, args.model, prompt))
            repeats.append(one_token_seconds(server, args.model, prompt))
    ratios = [r / f for f, r in zip(firsts, repeats, strict=True)]
    return {"prompt_tokens": args.prompt_tokens, "first_s": firsts, "repeat_s": repeats,
            "repeat_over_first": statistics.median(ratios)}


def one_token_seconds(server: ServerProcess, model: str, prompt: list[int]) -> float:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    start = time.perf_counter()
    httpx.post(server.url + "/v1/completions", json=body, timeout=600).raise_for_status()
    return time.perf_counter() - start


def replay(args: argparse.Namespace, out: Path, cache: str) -> dict:
    """``tropical bench`` on the conversation slice against a server with the cache ``cache``."""
    with running(args.model, out / f"slice-{cache}.log", ["--prefix-cache", cache]) as server:
        command = [TROPICAL, "bench", "--url", server.url, "--trace", "conversation",
                   "--limit", str(args.limit),
                   "--max-input", str(args.max_input), "--max-output", str(args.max_output),
                   "--rate", str(args.rate), "--seed", "0", "--timeout", "1200", "--json"]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        queries, hits = (metric(server, f"tropical_prefix_cache_{kind}_total")
                         for kind in ("queries", "hits"))
    return {"ttft_p50_s": summary["ttft_p50_s"], "goodput_rps": summary["goodput_rps"],
            "completed": summary.get("completed"), "hit_rate": hits / queries if queries else 0.0}


def metric(server: ServerProcess, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name)


class running:
    """`tropical serve` (one colocated worker) for the body of a with block, stopped by PID."""

    def __init__(self, model: str, log: Path, extra: list[str]) -> None:
        self.args, self.log = ["--model", model, *SERVE, *extra], log

    def __enter__(self) -> ServerProcess:
        self.server = ServerProcess.start(self.args, self.log, timeout=600)
        return self.server

    def __exit__(self, *_: object) -> None:
        self.server.stop()


def render(result: dict) -> str:
    rep, on, off = result["repeat"], result["slice"]["on"], result["slice"]["off"]
    return "\n".join([
        f"repeated {rep['prompt_tokens']}-token prompt: time to its token {rep['repeat_over_first']:.2f}x "
        f"the first's (median of {len(rep['first_s'])}; target <= 0.6)",
        f"conversation slice: P50 TTFT {on['ttft_p50_s']:.2f} s with the cache, {off['ttft_p50_s']:.2f} s "
        f"without: {result['p50_ttft_on_over_off']:.2f}x (target <= 0.6); goodput {on['goodput_rps']:.3f} vs "
        f"{off['goodput_rps']:.3f} req/s; hit rate {on['hit_rate']:.1%} (off: {off['hit_rate']:.1%})",
    ])


if __name__ == "__main__":
    sys.exit(main())
