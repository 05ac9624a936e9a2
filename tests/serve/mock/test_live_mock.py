"""`tropical serve --engine mock` as users run it: ready fast, requests through HTTP get the mock's
tokens, and the iteration log shows each iteration sleeping its profile's prediction."""

from __future__ import annotations

import statistics
from pathlib import Path

import httpx

from tests.live_server import live_server
from tropical.serve.iteration_log import read_iterations
from tropical.serve.mock.model import ANSWER


def test_a_request_through_the_mock_engine_gets_tokens_and_iterations_sleep_their_profile(tmp_path: Path
                                                                                          ) -> None:
    log = tmp_path / "it.jsonl"
    with live_server(tmp_path, "--engine", "mock", "--workers", "8", "--iteration-log", str(log)) as server:
        model = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
        body = {"model": model, "prompt": "hello " * 300, "max_tokens": 6}
        completion = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
        chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 4}).json()
    assert model == "mock-internlm2-20b"
    assert completion["usage"]["completion_tokens"] == 6
    assert completion["choices"][0]["text"] and completion["choices"][0]["text"].strip() in ANSWER * 2
    assert chat["choices"][0]["message"]["content"]
    records = read_iterations(log)
    assert any(r.shape.num_prefills for r in records) and any(r.shape.decode_count for r in records)
    assert all(r.compute >= r.predicted - 1e-3 for r in records), records
    # A mock that slept the wrong shape (or not at all) lands far from 1; loop wake-ups add a little.
    assert 0.999 <= statistics.median(r.compute / r.predicted for r in records) <= 1.5
