"""Summary: the simulator's metrics on measured times, plus ITL, goodput and failure reasons."""

from __future__ import annotations

import json

import pytest

from tropical.bench.record import Measurement
from tropical.bench.summary import summarize_bench
from tropical.core.slo import SLO

SLO_ = SLO(ttft=0.5, tpot=0.1)


def measured(rid: int, sent: float, chunks: list[float], error: str | None = None,
             tokens: list[int | None] | None = None) -> Measurement:
    m = Measurement(rid, 10, len(chunks), sent, saw_done=error is None, error=error)
    for t, k in zip(chunks, tokens or [1] * len(chunks), strict=True):
        m.add_chunk(t, k)
    m.close(chunks[-1] if chunks else sent + 1.0)
    return m


def summary_of(*ms: Measurement):
    return summarize_bench(ms, [m.to_request(SLO_) for m in ms])


def test_chunk_gaps_are_every_gap_between_chunks_of_completed_requests():
    s = summary_of(measured(0, 0.0, [0.2, 0.3, 0.5]), measured(1, 0.0, [0.1, 0.2]),
                   measured(2, 0.0, [0.1, 5.0], error="timed out after 1 s"))
    assert s.chunk_gap.p50 == pytest.approx(0.1) and s.chunk_gap.mean == pytest.approx(0.4 / 3)
    assert s.chunk_gap_max_s == pytest.approx(0.2) and s.itl == s.chunk_gap  # one token per chunk


def test_per_token_itl_spreads_a_gap_over_the_tokens_of_its_chunk():
    s = summary_of(measured(0, 0.0, [0.2, 0.5, 0.6], tokens=[1, 3, 1]))
    assert s.chunk_gap.p50 == pytest.approx(0.2)  # gaps 0.3 and 0.1
    assert s.itl.p50 == pytest.approx(0.1) and s.itl.mean == pytest.approx(0.4 / 4)  # .1 .1 .1 .1
    assert s.core.tpot.p50 == pytest.approx(0.4 / 4) and s.token_counts_estimated == 0


def test_stall_share_counts_completed_requests_with_a_gap_over_one_second():
    s = summary_of(measured(0, 0.0, [0.1, 1.3, 1.4]), measured(1, 0.0, [0.1, 0.2]),
                   measured(2, 0.0, [0.1, 0.9, 1.7]), measured(3, 0.0, [0.1, 9.0], error="timed out"))
    assert s.stall_share == pytest.approx(1 / 3)
    assert s.chunk_gap_max_s == pytest.approx(1.2)


def test_unstated_counts_are_estimated_and_say_so():
    m = measured(0, 0.0, [0.1, 0.2, 0.6], tokens=[None, None, None])
    m.usage_tokens = 6
    assert m.token_counts() == [1, 2, 3] and summary_of(m).token_counts_estimated == 1
    assert m.itls() == pytest.approx([0.05, 0.05, 0.4 / 3, 0.4 / 3, 0.4 / 3])


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
    assert "queue_p50_s" not in flat and flat["paths"] == {}
    assert flat["stall_share"] is None and flat["chunk_gap_max_s"] is None
    json.loads(json.dumps(flat), parse_constant=pytest.fail)
