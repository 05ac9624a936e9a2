"""vLLM instances' prefix caches through the router: what a running `tropical serve --engine vllm`
reports for the same ~1,300-token prompt three times (whole, again, streamed) and for one sharing
its first half, and its /metrics prefix-cache counters.

Usage: python benchmarks/vllm_prefix_cache.py URL [--model smollm2]
e.g. after: tropical serve --engine vllm --policy kv-router --workers 1 --max-model-len 2048
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import httpx

LANTERNS = " ".join(f"Item {i}: the {['red', 'green', 'blue', 'amber'][i % 4]} lantern hangs by door {i}."
                    for i in range(90))
BOXES = " ".join(f"Entry {i}: a {['small', 'large'][i % 2]} box sits on shelf {i}." for i in range(60))


def ask(url: str, model: str, prompt: str, stream: bool = False) -> dict:
    """Seconds to the whole reply, its prompt and cached tokens, and the instance it ran on."""
    body: dict = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=900)
    reply.raise_for_status()
    seconds = time.perf_counter() - start
    if stream:
        events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
        usage = [e["usage"] for e in events if e.get("usage")][-1]
    else:
        usage = reply.json()["usage"]
    return {"seconds": round(seconds, 2), "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "instance": reply.headers.get("x-tropical-prefill-worker")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--model", default="smollm2")
    args = parser.parse_args()
    result = {"first": ask(args.url, args.model, LANTERNS), "repeat": ask(args.url, args.model, LANTERNS),
              "repeat_streamed": ask(args.url, args.model, LANTERNS, stream=True),
              "half_shared": ask(args.url, args.model, LANTERNS[:len(LANTERNS) // 2] + " " + BOXES)}
    metrics = httpx.get(f"{args.url}/metrics", timeout=30).text
    result["metrics"] = [line for line in metrics.splitlines() if line.startswith("tropical_prefix_cache_")
                         and "_total" in line]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
