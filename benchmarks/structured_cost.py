"""What structured outputs cost per token: a grammar matcher's allowed() + accept() (llguidance).

Usage: python benchmarks/structured_cost.py [--model smollm2] [--walks 5] [--json]

Each token's mask and advance are timed in CPU time of this thread (llguidance computes in the
calling thread), on two kinds of output: a realistic JSON answer fed token by token as the tokenizer
splits it, and walks that take the argmax of seeded random logits under the mask until EOS or 1,000
tokens (under random logits a JSON string rarely closes). Beside them, once per server and once per
request: building llguidance's vocabulary, compiling a format, copying the compiled matcher for a run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tropical.engine.gguf_reader import Metadata, open_reader, read_vocab
from tropical.engine.loader import load_model, smollm2_path
from tropical.engine.tokenizer import Tokenizer
from tropical.report.tables import render
from tropical.serve.structured import JsonMatcher, compile_format, grammar_vocabulary

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string"},
        "languages": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city"]},
    },
    "required": ["name", "age", "languages"],
}
ANSWER = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.com",
          "languages": ["English", "French", "Italian"], "address": {"city": "London", "zip": "W1"}}
FORMATS = {
    "json_object": {"type": "json_object"},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
}


def tokenizer_of(model: str) -> Tokenizer:
    """The tokenizer alone (SmolLM2's from its GGUF vocabulary, without dequantizing the weights)."""
    if model != "smollm2":
        return load_model(model).tokenizer
    path = smollm2_path()
    return Tokenizer.from_gguf_vocab(read_vocab(Metadata(open_reader(path), path)))


def cpu_us(call: Callable[[], Any]) -> tuple[Any, float]:
    start = time.thread_time_ns()
    result = call()
    return result, (time.thread_time_ns() - start) / 1e3


def step_us(matcher: JsonMatcher, choose: Callable[[bytes], int]) -> tuple[int, float]:
    """One token: the mask, the choice (not timed), the advance; the token and the timed µs."""
    mask, mask_us = cpu_us(matcher.allowed)
    token = choose(mask)
    _, accept_us = cpu_us(lambda: matcher.accept(token))
    return token, mask_us + accept_us


def answer_steps(matcher: JsonMatcher, tokens: list[int]) -> list[float]:
    """Per-token µs while the matcher follows ``tokens`` (then EOS)."""
    feed = iter(tokens)
    return [step_us(matcher, lambda _mask: next(feed))[1] for _ in tokens]


def random_walk(matcher: JsonMatcher, vocab: int, eos: set[int], seed: int, limit: int = 1000) -> list[float]:
    """Per-token µs of a walk under the mask, argmax of seeded random logits, until EOS or ``limit``."""
    rng = np.random.default_rng(seed)

    def choose(mask: bytes) -> int:
        allowed = np.unpackbits(np.frombuffer(mask, np.uint8), bitorder="little")[:vocab].astype(bool)
        logits = np.where(allowed, rng.standard_normal(vocab), -np.inf)
        return int(np.argmax(logits))

    times = []
    for _ in range(limit):
        token, us = step_us(matcher, choose)
        times.append(us)
        if token in eos:
            break
    return times


def summary(name: str, times: list[float]) -> dict[str, Any]:
    cut = sorted(times)
    return {"case": name, "tokens": len(times), "median_us": statistics.median(times),
            "p90_us": cut[int(0.9 * (len(cut) - 1))], "max_us": cut[-1]}


def measure(model: str, walks: int) -> dict[str, Any]:
    tokenizer = tokenizer_of(model)
    _, vocab_us = cpu_us(lambda: grammar_vocabulary(tokenizer))  # the one compile_format uses
    answer = tokenizer.encode(json.dumps(ANSWER)) + tokenizer.eos_token_ids[:1]
    rows, once = [], {"vocab_size": tokenizer.vocab_size, "vocabulary_build_us": vocab_us}
    for kind, fmt in FORMATS.items():
        grammar, compile_us = cpu_us(lambda fmt=fmt: compile_format(fmt, tokenizer))
        assert grammar is not None
        copies = [cpu_us(grammar)[1] for _ in range(20)]
        once[f"{kind}_compile_us"] = compile_us
        once[f"{kind}_matcher_copy_us"] = statistics.median(copies)
        rows.append(summary(f"{kind}, answer", answer_steps(grammar(), answer)))
        walked = [t for seed in range(walks)
                  for t in random_walk(grammar(), tokenizer.vocab_size, set(tokenizer.eos_token_ids), seed)]
        rows.append(summary(f"{kind}, random walks", walked))
    return {"model": model, "once": once, "per_token": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--walks", type=int, default=5, help="random walks per format")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.model, args.walks)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.model}: {result['once']['vocab_size']} tokens")
    once = [[k, f"{v:.0f}"] for k, v in result["once"].items() if k != "vocab_size"]
    print(render(["once", "CPU µs"], once))
    per_token = [[r["case"], str(r["tokens"]), *(f"{r[k]:.0f}" for k in ("median_us", "p90_us", "max_us"))]
                 for r in result["per_token"]]
    print(render(["allowed()+accept() per token", "tokens", "median µs", "p90 µs", "max µs"], per_token))


if __name__ == "__main__":
    main()
