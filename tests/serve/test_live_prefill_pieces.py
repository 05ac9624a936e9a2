"""`tropical+` on the live server with prefill pieces: a prefill worker runs a prompt longer than
its piece in several iterations, each continuing from the KV the last one left, then hands the
KV over for decoding; every answer equals the engine's lone greedy run."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.live_server import live_server
from tropical.engine.generate import generate
from tropical.engine.loader import load_model
from tropical.serve.iteration_log import read_iterations

PIECE = 16
PROMPTS = ["tropical fish swim in warm seas " * 8, "a quiet harbour at dawn, gulls overhead " * 6]
RELAXED = {"slo_ttft_ms": 600_000, "slo_tpot_ms": 60_000}


def test_a_long_prompt_runs_in_pieces_on_a_prefill_worker_with_the_lone_greedy_tokens(
        tmp_path: Path) -> None:
    model = load_model("tiny-random")
    log = tmp_path / "iterations.jsonl"
    args = ("--policy", "tropical+", "--prefill-piece-tokens", str(PIECE), "--prefill-batch-tokens", "8",
            "--prefix-cache", "off", "--iteration-log", str(log))
    with live_server(tmp_path, *args) as server:
        replies = [httpx.post(f"{server.url}/v1/completions", timeout=120,
                              json={"model": "tiny-random", "prompt": prompt, "max_tokens": 6,
                                    "temperature": 0, "ignore_eos": True, **RELAXED})
                   for prompt in PROMPTS]
    for prompt, reply in zip(PROMPTS, replies, strict=True):
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-tropical-path"] == "prefill", reply.headers.get("x-tropical-reason")
        assert reply.json()["usage"]["prompt_tokens"] > 3 * PIECE
        assert reply.json()["choices"][0]["text"] == generate(model, prompt, 6, chat=False).text
    pieces = [r.shape for r in read_iterations(log) if r.shape.num_prefills and not r.shape.decode_count]
    assert max(s.prefill_tokens for s in pieces) == PIECE
    assert any(s.prefill_cached >= PIECE for s in pieces)      # a later piece, after the KV of earlier ones
