"""A live server with early rejection: a request no path can serve in time is refused before any
work with 429, a retry hint and a reason, and ordinary requests are served as before."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.live_server import LiveServer, live_server

HOPELESS_MS = "0.001"
"""A TTFT SLO of 1 us: no prediction meets it (1 ms did not stay hopeless: the tiny model's
profile, measured on a fast host, predicts its prompt's prefill in 0.7 ms)."""
BODY = {"model": "tiny-random", "prompt": "What is the capital of France?", "temperature": 0,
        "max_tokens": 4}


def _rejections(server: LiveServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "tropical_rejected")
    return {s.labels["reason"]: s.value for s in family.samples if s.name == "tropical_rejected_total"}


@pytest.mark.parametrize("policy", ["tropical", "colocated"])
def test_a_hopeless_request_gets_429_with_retry_after_and_the_next_is_served(tmp_path: Path, policy) -> None:
    with live_server(tmp_path, "--policy", policy, "--admission", "early-reject") as server:
        hopeless = httpx.post(f"{server.url}/v1/completions", json=BODY, timeout=60,
                              headers={"x-slo-ttft-ms": HOPELESS_MS})
        assert hopeless.status_code == 429, hopeless.text
        assert int(hopeless.headers["retry-after"]) >= 1
        error = hopeless.json()["error"]
        assert error["type"] == "rate_limit_exceeded" and "TTFT SLO" in error["message"]
        assert hopeless.headers["x-tropical-reason"] == error["message"]
        served = httpx.post(f"{server.url}/v1/completions", json=BODY, timeout=60)
        assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 4
        assert _rejections(server) == {"ttft": 1.0}
        assert server.health()["status"] == "ok"


def test_without_admission_the_same_request_is_served_late(tmp_path: Path) -> None:
    with live_server(tmp_path, "--policy", "colocated") as server:
        late = httpx.post(f"{server.url}/v1/completions", json=BODY, timeout=60,
                          headers={"x-slo-ttft-ms": HOPELESS_MS})
        assert late.status_code == 200
