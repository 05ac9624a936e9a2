"""Engine speed on this machine: continuous batching vs transformers, decode scaling, prefill FLOP rate,
and what sampling features (logprobs, penalties, bias) cost against plain requests.

Usage: python benchmarks/engine_speed.py [--model smollm2] [--requests 16] [--max-tokens 32] [--repeats 3]
                                       [--only features] [--against TREE [--rounds 6]] [--json]
Everything runs side by side in one process on the same weights, and is reported as ratios, so the
numbers compare with each other rather than with another machine. ``--against TREE`` (a source
tree holding ``src/`` and ``benchmarks/``, e.g. ``git archive <commit> src benchmarks | tar -x -C
TREE``) times plain greedy requests in this tree and in TREE instead, in alternating child
processes: CPU seconds of each (best of ``--repeats``, per round), their ratio, and whether both
generated the same tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.engine.batch import FlatBatch, Span
from tropical.engine.config import ModelConfig
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.loader import load_model
from tropical.engine.model import LlamaModel
from tropical.engine.profiler import median_seconds
from tropical.engine.runner import EngineWorker
from tropical.engine.sampling import SamplingParams
from tropical.report.tables import render

BLOCK_SIZE = 16
HF_BATCH = 8
PROMPT_RANGE = (16, 200)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DECODE_CONTEXT = 128
PREFILL_TOKENS = 512
NO_SLO = SLO(ttft=math.inf, tpot=math.inf)
GREEDY = SamplingParams()


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Seeded random token prompts of varied length: the throughput test is about shapes, not text."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(*PROMPT_RANGE))] for _ in range(n)]


def output_lengths(n: int, mean: int, varied: bool, seed: int = 0) -> list[int]:
    """Tokens to generate per request: all `mean`, or a seeded exponential around `mean` clipped to
    [1, 4 x mean], the long tail real traces have, where static batching runs each batch to its longest."""
    if not varied:
        return [mean] * n
    rng = random.Random(seed)
    return [min(max(1, round(rng.expovariate(1 / mean))), 4 * mean) for _ in range(n)]


# ---- 1. throughput: our engine vs transformers generate -------------------------------------------


Outputs = list[list[int]]


def run_engine(model: LlamaModel, prompts: list[list[int]], lengths: list[int],
               params: SamplingParams = GREEDY) -> tuple[float, Outputs]:
    """(wall seconds, generated ids) through EngineWorker, every request sampled by ``params``; no
    eos ids, so every request runs to its length."""
    blocks = sum(-(-(len(p) + n) // BLOCK_SIZE) for p, n in zip(prompts, lengths, strict=True)) + len(prompts)
    cache = PagedKVCache(model.config, num_blocks=blocks, block_size=BLOCK_SIZE)
    worker = EngineWorker(model, cache)
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        worker.submit(Request(i, 0.0, len(prompt), n, NO_SLO), prompt, params)
    outputs: dict[int, list[int]] = {}
    start = time.perf_counter()
    while worker.has_work:
        report = worker.step(time.perf_counter() - start)
        outputs.update((f.req.id, f.token_ids) for f in report.finished)
    return time.perf_counter() - start, [outputs[i] for i in range(len(prompts))]


def hf_config(config: ModelConfig) -> LlamaConfig:
    """The transformers config equivalent to ours; no eos id, so generate never stops or suppresses early."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        rope.update((k, v) for k, v in asdict(config.rope_scaling).items() if v is not None)
    return LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim, rms_norm_eps=config.rms_norm_eps, rope_parameters=rope,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings, bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )


def hf_twin(model: LlamaModel) -> LlamaForCausalLM:
    """transformers' LlamaForCausalLM holding our exact weights (parameter names already match)."""
    hf = LlamaForCausalLM(hf_config(model.config))
    hf.load_state_dict(model.state_dict(), strict=True)
    if model.config.tie_word_embeddings:
        hf.tie_weights()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf.eval()


@torch.no_grad()
def hf_generate(hf: LlamaForCausalLM, prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """Static batching: one left-padded greedy generate call runs the whole batch to its longest output;
    each request keeps its own length of it."""
    width, longest = max(len(p) for p in prompts), max(lengths)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=longest,
                      min_new_tokens=longest, pad_token_id=0)
    return [row[:n] for row, n in zip(out[:, width:].tolist(), lengths, strict=True)]


def run_hf(hf: LlamaForCausalLM, prompts: list[list[int]], lengths: list[int]) -> tuple[float, Outputs]:
    """(wall seconds, generated ids) for transformers in batches of HF_BATCH, in arrival order."""
    outputs: list[list[int]] = []
    start = time.perf_counter()
    for i in range(0, len(prompts), HF_BATCH):
        outputs += hf_generate(hf, prompts[i:i + HF_BATCH], lengths[i:i + HF_BATCH])
    return time.perf_counter() - start, outputs


def throughput(model: LlamaModel, hf: LlamaForCausalLM, prompts: list[list[int]], lengths: list[int],
               repeats: int) -> dict[str, float]:
    """Best of `repeats` alternating runs of the same requests through both (this machine is shared)."""
    ours_s = hf_s = math.inf
    for _ in range(repeats):
        seconds, ours = run_engine(model, prompts, lengths)
        ours_s = min(ours_s, seconds)
        seconds, theirs = run_hf(hf, prompts, lengths)
        hf_s = min(hf_s, seconds)
    tokens = sum(lengths)
    return {
        "requests": len(prompts), "mean_tokens": tokens / len(prompts), "max_tokens": max(lengths),
        "engine_s": ours_s, "hf_s": hf_s, "engine_tok_s": tokens / ours_s, "hf_tok_s": tokens / hf_s,
        "speedup": hf_s / ours_s,
        "equal_outputs": sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(prompts),
    }


def throughputs(model: LlamaModel, n: int, mean: int, repeats: int) -> dict[str, dict[str, float]]:
    """Equal and varied output lengths on the same prompts; warm-up first so neither side pays
    one-off allocation in the timing."""
    prompts = make_prompts(n, model.config.vocab_size)
    hf = hf_twin(model)
    run_engine(model, prompts[:2], [2, 2])
    run_hf(hf, prompts[:2], [2, 2])
    return {name: throughput(model, hf, prompts, output_lengths(n, mean, varied), repeats)
            for name, varied in (("equal", False), ("varied", True))}


# ---- 2. decode step time vs batch size -------------------------------------------------------------


def best_of(repeats: int, measure: Callable[[], float]) -> float:
    """Lowest of `repeats` measurements: others share this machine, and their noise only adds time."""
    return min(measure() for _ in range(repeats))


def decode_scaling(model: LlamaModel, repeats: int) -> dict[int, float]:
    """Decode-step seconds (best of `repeats` medians) per batch size at DECODE_CONTEXT tokens of context.

    The context's K/V is seeded noise rather than prefilled: a step's cost depends on shapes, not values,
    and prefilling 64 x 128 tokens would dominate the benchmark on a small CPU. Noise, not the cache's
    zeros, so attention reads real memory rather than one shared zero page.
    """
    blocks = max(DECODE_BATCHES) * -(-DECODE_CONTEXT // BLOCK_SIZE)
    cache = PagedKVCache(model.config, num_blocks=blocks, block_size=BLOCK_SIZE)
    generator = torch.Generator().manual_seed(0)
    cache.k.normal_(generator=generator)
    cache.v.normal_(generator=generator)
    result = {}
    for size in DECODE_BATCHES:
        spans = [Span(i, [i + 1], DECODE_CONTEXT - 1) for i in range(size)]
        step = lambda s=spans: model(FlatBatch.build(s, cache), cache)  # noqa: E731
        result[size] = best_of(repeats, lambda f=step: median_seconds(f, repeats=5, warmup=1))
    return result


# ---- 3. prefill FLOP rate vs plain torch.matmul ------------------------------------------------------


def gemm_shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """(in, out) of each linear layer in one decoder layer."""
    h, q, kv, inter = (config.hidden_size, config.num_attention_heads * config.head_dim,
                       config.num_key_value_heads * config.head_dim, config.intermediate_size)
    return [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]


def prefill_flops(config: ModelConfig, n: int) -> tuple[float, float]:
    """(linear FLOPs, attention FLOPs) of one n-token prefill as our forward executes it.

    Linear: 2 x n x params of every layer's projections, plus lm_head on the last token only (the
    forward only computes the logits it samples). Attention: QK^T and AV over the full n x n score
    matrix per head (4 n^2 H D per layer), the model-FLOPs convention of MFU figures: fixed by the shape,
    whatever part of the masked half a kernel skips (ours skips most of it, in query chunks), so the
    report also gives the fraction counting linear FLOPs alone, a lower bound.
    """
    per_layer = sum(i * o for i, o in gemm_shapes(config))
    linear = 2 * n * per_layer * config.num_hidden_layers + 2 * config.hidden_size * config.vocab_size
    attention = 4 * n * n * config.num_attention_heads * config.head_dim * config.num_hidden_layers
    return float(linear), float(attention)


def matmul_rate(config: ModelConfig, n: int) -> float:
    """FLOP/s of bare torch.matmul over the same GEMMs as the prefill's linear layers (incl. lm_head)."""
    shapes = [(n, i, o) for i, o in gemm_shapes(config)]
    seconds, flops = 0.0, 0.0
    for m, k, o in shapes:
        a, b = torch.randn(m, k), torch.randn(k, o)
        gemm = median_seconds(lambda a=a, b=b: torch.matmul(a, b), repeats=5, warmup=1)
        seconds += gemm * config.num_hidden_layers
        flops += 2.0 * m * k * o * config.num_hidden_layers
    a, b = torch.randn(1, config.hidden_size), torch.randn(config.hidden_size, config.vocab_size)
    seconds += median_seconds(lambda: torch.matmul(a, b), repeats=5, warmup=1)
    flops += 2.0 * config.hidden_size * config.vocab_size
    return flops / seconds


def prefill_rate(model: LlamaModel, n: int, repeats: int) -> dict[str, float]:
    """Our prefill's achieved FLOP rate and its fraction of what torch.matmul reaches on the same GEMMs,
    each the best of `repeats` rounds."""
    cache = PagedKVCache(model.config, num_blocks=-(-n // BLOCK_SIZE), block_size=BLOCK_SIZE)
    ids = make_prompts(1, model.config.vocab_size, seed=1)[0] * (n // PROMPT_RANGE[0] + 1)
    span = [Span(0, ids[:n], 0)]
    seconds = best_of(repeats, lambda: median_seconds(
        lambda: model(FlatBatch.build(span, cache), cache), repeats=3, warmup=1))
    linear, attention = prefill_flops(model.config, n)
    reference = max(matmul_rate(model.config, n) for _ in range(repeats))
    rate = (linear + attention) / seconds
    return {"tokens": n, "prefill_s": seconds, "linear_gflop": linear / 1e9,
            "attention_gflop": attention / 1e9, "gflop_s": rate / 1e9,
            "matmul_gflop_s": reference / 1e9, "fraction": rate / reference,
            "linear_fraction": linear / seconds / reference}


# ---- 4. sampling features against plain requests ------------------------------------------------

FEATURES = {
    "plain": GREEDY,
    "logprobs 5": SamplingParams(logprobs=5),
    "logprobs 20": SamplingParams(logprobs=20),
    "penalties": SamplingParams(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2),
    "bias + min_tokens": SamplingParams(logit_bias=((1, 5.0), (2, -5.0)), min_tokens=8),
    "temperature 0.8": SamplingParams(temperature=0.8, seed=0),
}


def feature_costs(model: LlamaModel, n: int, mean: int, repeats: int) -> dict[str, float]:
    """CPU seconds (best of ``repeats`` rounds, the settings alternating within each round; CPU time,
    as other work on a shared machine stretches wall time) to serve the same requests with each of
    FEATURES: what a request pays for what it asks."""
    prompts, lengths = make_prompts(n, model.config.vocab_size), output_lengths(n, mean, False)
    run_engine(model, prompts[:2], [2, 2])
    best = dict.fromkeys(FEATURES, math.inf)
    for _ in range(repeats):
        for name, params in FEATURES.items():
            start = time.process_time()
            run_engine(model, prompts, lengths, params)
            best[name] = min(best[name], time.process_time() - start)
    return best


# ---- report -------------------------------------------------------------------------------------------


def print_tables(tps: dict[str, dict[str, float]], decode: dict[int, float],
                 prefill: dict[str, float]) -> None:
    """Plain-text tables, one per measurement."""
    print(render(["outputs", "tokens mean/max", "engine s", "transformers s", "engine tok/s",
                  "transformers tok/s", "speedup", "equal outputs"], [
        [name, f"{tp['mean_tokens']:.1f}/{tp['max_tokens']}", f"{tp['engine_s']:.2f}", f"{tp['hf_s']:.2f}",
         f"{tp['engine_tok_s']:.1f}", f"{tp['hf_tok_s']:.1f}", f"{tp['speedup']:.2f}x",
         f"{tp['equal_outputs']:.0%}"] for name, tp in tps.items()
    ]))
    requests = next(iter(tps.values()))["requests"]
    print(f"(the same {requests} prompts, greedy; engine: continuous batching, transformers: generate "
          f"in static batches of {HF_BATCH})\n")
    print(render(["decode batch", "step ms", "vs batch 1", "per seq ms"], [
        [str(b), f"{s * 1e3:.1f}", f"{s / decode[1]:.2f}x", f"{s * 1e3 / b:.2f}"] for b, s in decode.items()
    ]))
    print()
    print(render(["prefill", "tokens", "ms", "GFLOP", "GFLOP/s", "matmul GFLOP/s", "fraction",
                  "linear only"], [[
        "engine", str(prefill["tokens"]), f"{prefill['prefill_s'] * 1e3:.0f}",
        f"{prefill['linear_gflop'] + prefill['attention_gflop']:.1f}", f"{prefill['gflop_s']:.1f}",
        f"{prefill['matmul_gflop_s']:.1f}", f"{prefill['fraction']:.0%}", f"{prefill['linear_fraction']:.0%}",
    ]]))
    print("(FLOPs: linear layers for all tokens, lm_head for the last token only, attention as dense n x n;\n"
          " 'linear only' leaves attention out of the FLOPs but not out of the time)")


def print_features(features: dict[str, float], tokens: int) -> None:
    plain = features["plain"]
    print(render(["sampling", "engine CPU s", "tok/CPU s", "vs plain"], [
        [name, f"{s:.2f}", f"{tokens / s:.1f}", f"{s / plain:.3f}x"] for name, s in features.items()
    ]))
    print(f"(the same {tokens} output tokens each; time relative to plain requests, same run)")


PLAIN_RUN = """
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
from benchmarks.engine_speed import make_prompts, output_lengths, run_engine
from tropical.engine.loader import load_model
model = load_model(sys.argv[2]).model
n, mean, repeats = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
prompts, lengths = make_prompts(n, model.config.vocab_size), output_lengths(n, mean, False)
run_engine(model, prompts[:2], [2, 2])
best, outs = float("inf"), None
for _ in range(repeats):
    start = time.process_time()
    _, outs = run_engine(model, prompts, lengths)
    best = min(best, time.process_time() - start)
print(json.dumps({"cpu_s": best, "outputs": outs}))
"""
"""One tree's plain greedy requests, timed in a child process that imports that tree alone."""


def plain_cpu(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": str(torch.get_num_threads())}
    out = subprocess.run([sys.executable, "-c", PLAIN_RUN, str(tree), args.model, str(args.requests),
                          str(args.max_tokens), str(args.repeats)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def against(args: argparse.Namespace) -> dict[str, Any]:
    """This tree's plain requests against ``args.against``'s, alternating which runs first."""
    here, there = Path(__file__).resolve().parents[1], Path(args.against).resolve()
    runs: dict[str, list[dict[str, Any]]] = {"here": [], "there": []}
    for i in range(args.rounds):
        order = [("here", here), ("there", there)][:: 1 if i % 2 == 0 else -1]
        for name, tree in order:
            runs[name].append(plain_cpu(tree, args))
    cpu = {name: [r["cpu_s"] for r in got] for name, got in runs.items()}
    ratios = [h / t for h, t in zip(cpu["here"], cpu["there"], strict=True)]
    same = all(r["outputs"] == runs["there"][0]["outputs"] for got in runs.values() for r in got)
    return {"against": str(there), "cpu_s": cpu, "ratio_mean": statistics.mean(ratios),
            "ratio_stdev": statistics.stdev(ratios) if len(ratios) > 1 else 0.0, "ratios": ratios,
            "same_tokens": same, "tokens": args.requests * args.max_tokens}


def print_against(result: dict[str, Any]) -> None:
    cpu = result["cpu_s"]
    print(render(["tree", "mean CPU s", "rounds"], [
        ["this", f"{statistics.mean(cpu['here']):.2f}", str(len(cpu["here"]))],
        [result["against"], f"{statistics.mean(cpu['there']):.2f}", str(len(cpu["there"]))]]))
    print(f"this / that: {result['ratio_mean']:.3f}x (per-round stdev {result['ratio_stdev']:.3f}), "
          f"same tokens: {result['same_tokens']} ({result['tokens']} plain greedy output tokens a run)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens (the mean when varied)")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs of each measurement")
    parser.add_argument("--only", choices=["features"], help="run this section alone")
    parser.add_argument("--against", help="a source tree to time plain requests against")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds with --against")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.against:
        result = against(args)
        if args.json:
            print(json.dumps(result))
        else:
            print_against(result)
        return
    start = time.perf_counter()
    model = load_model(args.model).model
    features = feature_costs(model, args.requests, args.max_tokens, args.repeats)
    if args.only == "features":
        if args.json:
            print(json.dumps({"model": args.model, "threads": torch.get_num_threads(),
                              "features_s": features}))
        else:
            print_features(features, args.requests * args.max_tokens)
        return
    tp = throughputs(model, args.requests, args.max_tokens, args.repeats)
    decode = decode_scaling(model, args.repeats)
    prefill = prefill_rate(model, PREFILL_TOKENS, args.repeats)
    wall = time.perf_counter() - start
    if args.json:
        print(json.dumps({"model": args.model, "threads": torch.get_num_threads(), "throughput": tp,
                          "decode_step_s": decode, "prefill": prefill, "features_s": features,
                          "wall_s": wall}))
        return
    print(f"model {args.model}, torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print_tables(tp, decode, prefill)
    print()
    print_features(features, args.requests * args.max_tokens)
    print(f"\ntotal {wall:.1f} s")


if __name__ == "__main__":
    main()
