"""The client against a scripted server: timing math, usage counting, and every kind of failure."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from tests.bench.fake_server import MODEL, Script
from tropical.bench.plan import PlannedRequest
from tropical.bench.record import Measurement
from tropical.bench.replay import replay
from tropical.bench.server import Endpoint
from tropical.core.metrics import tpot, ttft
from tropical.core.slo import SLO

TOL = 0.03  # seconds of scheduling and network jitter on a loaded 2-core machine
SLO_ = SLO(ttft=1.0, tpot=0.1)


def run(url: str, planned: list[PlannedRequest], timeout: float = 5.0) -> list[Measurement]:
    return asyncio.run(replay(planned, Endpoint(url), MODEL, "ids", 0, timeout))


def one(output: int = 5, send_at: float = 0.0, rid: int = 0) -> PlannedRequest:
    return PlannedRequest(rid, send_at, prompt_len=8, output_len=output)


def test_ttft_tpot_and_itl_follow_the_scripted_token_times(fake_server):
    url = fake_server(Script(first_delay=0.2, gap=0.05))
    [m] = run(url, [one(output=5)])
    req = m.to_request(SLO_)
    assert m.error is None and m.tokens == 5 and len(m.chunks) == 5
    assert ttft(req) >= 0.2  # the server waited that long before its first chunk
    assert tpot(req) == pytest.approx(sum(m.chunk_gaps()) / 4)
    assert tpot(req) == pytest.approx(0.05, abs=TOL)  # chunks are timed as they arrive, 0.05 s apart
    assert m.itls() == m.chunk_gaps()  # one token per chunk: per-token ITL is the chunk gap


def test_metrics_are_the_simulators_formulas_on_the_measured_times(fake_server):
    [m] = run(fake_server(Script(first_delay=0.01, gap=0.01)), [one(output=4)])
    req = m.to_request(SLO_)
    assert (req.arrival, req.first_token, req.finish) == (m.sent, m.chunks[0], m.chunks[-1])
    assert req.max_gap == max(m.chunk_gaps())          # the longest wait a user saw between chunks
    assert ttft(req) == m.chunks[0] - m.sent
    assert tpot(req) == (m.chunks[-1] - m.chunks[0]) / 3


# Chunks as SmolLM2 streams them: several tokens behind one character, tokens with no text, and a
# last chunk with empty text that carries a token and the finish reason. Sent at 0.1 0.2 0.4 0.5 0.6.
UNEVEN = ((0.1, 1, " a"), (0.1, 2, " bc"), (0.2, 1, ""), (0.1, 3, " def"), (0.1, 1, ""))


# Exact relations on the measured chunk times, not wall-clock values: a loaded machine delays chunks.
def test_stated_token_counts_give_per_token_itl_and_chunk_gaps_apart(fake_server):
    [m] = run(fake_server(Script(chunks=UNEVEN, state_tokens=True)), [one(output=8)])
    assert m.error is None and m.tokens == 8 and m.chunk_tokens == [1, 2, 1, 3, 1]
    g = m.chunk_gaps()
    assert len(g) == 4 and g == pytest.approx(np.diff(m.chunks).tolist())
    assert m.itls() == pytest.approx([g[0] / 2] * 2 + [g[1]] + [g[2] / 3] * 3 + [g[3]])


def test_the_empty_final_chunk_ends_the_request_and_the_usage_chunk_does_not(fake_server):
    [m] = run(fake_server(Script(chunks=UNEVEN, state_tokens=True)), [one(output=8)])
    req = m.to_request(SLO_)
    assert len(m.chunks) == 5 and m.tokens == 8  # five token chunks; the usage chunk adds no time
    assert req.finish == m.chunks[-1] <= m.end
    assert ttft(req) == m.chunks[0] - m.sent
    assert tpot(req) == pytest.approx((m.chunks[-1] - m.chunks[0]) / 7)
    assert sum(m.itls()) == pytest.approx(m.chunks[-1] - m.chunks[0])


def test_without_stated_counts_usage_is_spread_over_the_chunks(fake_server):
    [m] = run(fake_server(Script(chunks=UNEVEN)), [one(output=8)])
    assert m.chunk_tokens == [None] * 5 and not m.counted and m.tokens == 8
    counts = m.token_counts()
    assert counts[0] == 1 and sum(counts) == 8 and max(counts) - min(counts[1:]) <= 1
    assert counts[1 + int(np.argmax(m.chunk_gaps()))] == 2  # the chunk after the longest gap gets one more
    assert len(m.itls()) == 7 and sum(m.itls()) == pytest.approx(m.chunks[-1] - m.chunks[0])


def test_a_chunk_stating_zero_tokens_is_no_token_chunk(fake_server):
    script = Script(chunks=((0.0, 1, " a"), (0.05, 1, " b"), (0.05, 0, "")), state_tokens=True)
    [m] = run(fake_server(script), [one(output=2)])
    assert m.chunk_tokens == [1, 1] and m.tokens == 2


def test_the_servers_path_headers_are_recorded_when_sent(fake_server):
    headers = {"x-tropical-path": "multiplex", "x-tropical-prefill-worker": "1",
               "x-tropical-reason": "TTFT at risk"}
    [m] = run(fake_server(Script(first_delay=0.0, gap=0.0, headers=headers)), [one(output=2)])
    assert (m.path, m.prefill_worker, m.reason) == ("multiplex", "1", "TTFT at risk")
    [plain] = run(fake_server(Script(first_delay=0.0, gap=0.0)), [one(output=2)])
    assert (plain.path, plain.prefill_worker, plain.reason) == (None, None, None)


def test_requests_are_sent_at_their_scaled_arrival_times(fake_server):
    """Never early; open loop (all sent before the first answer, 1 s after the first send); late
    only by scheduling, by less than half the spacing, so a 2-core machine's stalls do not race it."""
    planned = (0.0, 0.2, 0.4)
    url = fake_server(Script(first_delay=1.0, gap=0.0))
    ms = run(url, [one(output=1, send_at=t, rid=i) for i, t in enumerate(planned)])
    assert all(t <= m.sent < t + 0.1 for m, t in zip(ms, planned, strict=True)), [m.sent for m in ms]
    assert max(m.sent for m in ms) < min(m.chunks[0] for m in ms)


def test_the_request_asks_for_exactly_the_trace_output(fake_server):
    script = Script(first_delay=0.0, gap=0.0)
    run(fake_server(script), [one(output=3)])
    [body] = script.received
    assert body["max_tokens"] == 3 and body["ignore_eos"] and body["stream"]
    assert body["stream_options"] == {"include_usage": True}
    assert body["model"] == MODEL and len(body["prompt"]) == 8


def test_without_usage_the_chunks_are_counted(fake_server):
    [m] = run(fake_server(Script(first_delay=0.0, gap=0.0, send_usage=False)), [one(output=3)])
    assert m.usage_tokens is None and m.tokens == 3 and m.error is None


def test_unicode_line_breaks_inside_token_text_do_not_split_events(fake_server):
    script = Script(first_delay=0.0, gap=0.0, token_text=" a\u2028b\x85c\u2029{i}")
    [m] = run(fake_server(script), [one(output=3)])
    assert m.error is None and m.tokens == 3 and len(m.chunks) == 3


def test_http_errors_are_counted_with_their_status(fake_server):
    ms = run(fake_server(Script(status=500)), [one(rid=0), one(rid=1)])
    assert all(m.error.startswith("HTTP 500") for m in ms)
    assert not any(m.to_request(SLO_).finish is None for m in ms)


def test_a_hanging_stream_times_out_and_the_run_ends(fake_server):
    url = fake_server(Script(first_delay=0.0, gap=0.0, hang_after=2))
    started = time.monotonic()
    [m] = run(url, [one(output=5)], timeout=0.3)
    assert time.monotonic() - started < 3
    assert m.error == "timed out after 0.3 s" and len(m.chunks) == 2


def test_a_stream_that_ends_without_done_is_a_failure(fake_server):
    [m] = run(fake_server(Script(first_delay=0.0, gap=0.0, send_done=False)), [one()])
    assert m.error == "stream ended without [DONE]"


def test_an_unreachable_server_fails_every_request_quickly(fake_server):
    url = fake_server(Script())
    dead = url.rsplit(":", 1)[0] + ":1"
    ms = run(dead, [one(rid=0), one(rid=1)])
    assert all(m.error and "Connect" in m.error for m in ms)
