"""Summary: the simulator's metrics on measured times, plus ITL, goodput and failure reasons."""

from __future__ import annotations

import json

import pytest

from tropical.bench.record import Measurement
from tropical.bench.summary import summarize_bench
from tropical.core.slo import SLO

SLO_ = SLO(ttft=0.5, tpot=0.1)


def measured(rid: int, sent: float, chunks: list[float], error: str | None = None) -> Measurement:
    m = Measurement(rid, 10, len(chunks), sent, list(chunks), saw_done=error is None, error=error)
    m.close(chunks[-1] if chunks else sent + 1.0)
    return m


def summary_of(*ms: Measurement):
    return summarize_bench(ms, [m.to_request(SLO_) for m in ms])


def test_itl_is_every_gap_between_chunks_of_completed_requests():
    s = summary_of(measured(0, 0.0, [0.2, 0.3, 0.5]), measured(1, 0.0, [0.1, 0.2]),
                   measured(2, 0.0, [0.1, 5.0], error="timed out after 1 s"))
    assert s.itl.p50 == pytest.approx(0.1) and s.itl.mean == pytest.approx(0.4 / 3)


def test_goodput_counts_attaining_requests_per_second_of_the_run():
    good = measured(0, 0.0, [0.2, 0.3, 0.4])          # ttft .2, tpot .1
    slow = measured(1, 1.0, [2.0, 2.1])               # ttft 1.0 > .5
    s = summary_of(good, slow)
    assert s.duration_s == pytest.approx(2.1)
    assert s.goodput_rps == pytest.approx(1 / 2.1)
    assert s.core.attainment == 0.5


def test_failures_are_counted_by_reason_and_miss_their_slo():
    s = summary_of(measured(0, 0.0, [0.1, 0.2]), measured(1, 0.0, [], error="HTTP 500: boom"),
                   measured(2, 0.0, [], error="HTTP 500: boom"))
    assert (s.core.requests, s.core.completed, s.core.failed) == (3, 1, 2)
    assert s.failures == {"HTTP 500: boom": 2}
    assert s.core.attainment == pytest.approx(1 / 3)


def test_an_empty_stream_is_a_failure_not_a_zero_token_request():
    m = Measurement(0, 10, 5, saw_done=True)
    m.close(1.0)
    assert m.error == "stream ended without tokens"


def test_json_has_no_nan_when_nothing_completed():
    flat = summary_of(measured(0, 0.0, [], error="refused")).as_dict()
    assert flat["ttft_p50_s"] is None and flat["goodput_rps"] == 0.0
    assert "queue_p50_s" not in flat and "paths" not in flat
    json.loads(json.dumps(flat), parse_constant=pytest.fail)
