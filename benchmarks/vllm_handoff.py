"""The prefill-to-decode hand-off cost and greedy equality of `tropical serve --engine vllm`.

For each prompt length: one request through Path 1 (prefill instance, then NIXL hand-off to the
multiplexing instance), timed by the router's own histogram of hand-offs (prefill reply to the
decode instance's first token), and a prompt of the same length sent straight to the multiplexing
instance, whose TTFT is what the decode side would pay to recompute the prompt instead.
Then the chat question through both paths and straight to one vLLM instance, greedy, compared.

Usage: python benchmarks/vllm_handoff.py URL [LENGTH ...]   (a running `tropical serve --engine vllm`)
Each length runs 3 times.
Prints one JSON object.
"""

from __future__ import annotations

import json
import sys
import time

import httpx

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
REPEATS = 3


def handoff_total(url: str) -> tuple[float, float]:
    """(sum of seconds, count) of the router's hand-off histogram."""
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(("tropical_migration_seconds_sum", "tropical_migration_seconds_count")):
            name, value = line.split()
            values[name.rsplit("_", 1)[1]] = float(value)
    return values.get("sum", 0.0), values.get("count", 0.0)


def ttft(url: str, body: dict) -> tuple[float, str]:
    """Seconds to the first streamed token, and the path the router reports (if it is one)."""
    start = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=600) as reply:
        reply.raise_for_status()
        lines = reply.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                first = time.perf_counter() - start
                for _ in lines:
                    pass
                return first, reply.headers.get("x-tropical-path", "")
    raise RuntimeError("no token streamed")


def prompt(length: int, first: int) -> list[int]:
    """Token ids whose first one differs between requests, so no prefix cache shortens a prefill."""
    return [first, *(200 + i % 900 for i in range(length - 1))]


def handoff_row(url: str, length: int, repeat: int) -> dict:
    body = {"model": "smollm2", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    first = 1000 + 10 * length + repeat
    before = handoff_total(url)
    path1_ttft, path1 = ttft(url, {**body, "prompt": prompt(length, first), "slo_ttft_ms": 600000})
    after = handoff_total(url)
    local_ttft, _ = ttft(decode_instance(url), {**body, "prompt": prompt(length, first + 5)})
    return {"prompt_tokens": length, "path": path1, "path1_ttft_s": path1_ttft,
            "handoff_s": (after[0] - before[0]) if after[1] > before[1] else None,
            "local_prefill_ttft_s": local_ttft}


def decode_instance(url: str) -> str:
    """The multiplexing (last) instance's own URL, from the router's /health."""
    return httpx.get(f"{url}/health", timeout=30).json()["workers"][-1]["node"]


def answers(url: str) -> dict:
    """The greedy chat answer through each path and from the multiplexing instance alone."""
    body = {"model": "smollm2", "messages": QUESTION, "temperature": 0, "max_tokens": 32}
    out = {}
    for name, slo in (("path1", 600000), ("path2", 1)):
        reply = httpx.post(f"{url}/v1/chat/completions", json={**body, "slo_ttft_ms": slo}, timeout=600)
        out[name] = {"path": reply.headers.get("x-tropical-path"),
                     "text": reply.json()["choices"][0]["message"]["content"]}
    alone = httpx.post(f"{decode_instance(url)}/v1/chat/completions", json=body, timeout=600).json()
    out["single_instance"] = {"text": alone["choices"][0]["message"]["content"]}
    out["all_equal"] = len({v["text"] for v in out.values()}) == 1
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    url, lengths = argv[0].rstrip("/"), [int(n) for n in argv[1:]] or [500, 1000, 1900]
    rows = [handoff_row(url, n, repeat) for n in lengths for repeat in range(REPEATS)]
    print(json.dumps({"handoff": rows, "greedy": answers(url)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
