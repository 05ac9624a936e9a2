import math
from dataclasses import replace

import pytest

from tests.factories import make_request
from tropical.core.gaps import GapHistogram
from tropical.core.metrics import Distribution, attains, miss_cause, stream_attains, summarize, tpot, ttft
from tropical.core.request import PrefillPath


def finished(rid: int, arrival: float, start: float, first: float, finish: float,
             output: int, ttft_slo: float = 1.0, tpot_slo: float = 0.1):
    req = make_request(rid, arrival, output=output, ttft=ttft_slo, tpot=tpot_slo)
    req.prefill_start, req.first_token, req.finish = start, first, finish
    req.path = PrefillPath.COLOCATED
    return req


def test_ttft_and_tpot_follow_vllm_definitions():
    req = finished(0, arrival=1.0, start=1.5, first=2.0, finish=3.8, output=10)
    assert ttft(req) == pytest.approx(1.0)
    assert tpot(req) == pytest.approx(1.8 / 9)


def test_single_output_token_has_zero_tpot():
    assert tpot(finished(0, 0.0, 0.0, 0.5, 0.5, output=1)) == 0.0


def test_attainment_is_joint_over_ttft_and_tpot():
    good = finished(0, 0.0, 0.0, 0.5, 1.4, output=10)            # ttft .5, tpot .1
    slow_first = finished(1, 0.0, 0.0, 1.5, 2.0, output=10)      # ttft 1.5 > 1
    slow_decode = finished(2, 0.0, 0.0, 0.5, 2.0, output=10)     # tpot .167 > .1
    assert [attains(r) for r in (good, slow_first, slow_decode)] == [True, False, False]


def test_failed_requests_count_against_attainment_but_not_latency():
    good = finished(0, 0.0, 0.2, 0.5, 1.4, output=10)
    failed = make_request(1)
    failed.fail(3.0, "too long")
    summary = summarize([good, failed])
    assert summary.attainment == 0.5
    assert (summary.completed, summary.failed) == (1, 1)
    assert summary.queueing.p50 == pytest.approx(0.2)


def test_summary_percentiles_and_throughput_on_hand_computed_case():
    reqs = [finished(i, arrival=float(i), start=float(i), first=i + 0.1 * (i + 1),
                     finish=i + 1.0, output=2) for i in range(10)]
    summary = summarize(reqs)
    assert summary.ttft.p50 == pytest.approx(0.55)
    assert summary.ttft.p90 == pytest.approx(0.91)
    assert summary.throughput_rps == pytest.approx(10 / 10.0)
    flat = summary.as_dict()
    assert flat["ttft_p90_s"] == summary.ttft.p90 and flat["queue_p90_s"] == 0.0


def test_empty_distribution_is_nan():
    assert math.isnan(Distribution.of([]).p90)


def test_stream_attainment_also_bounds_the_longest_gap():
    smooth = finished(0, 0.0, 0.0, 0.5, 1.4, output=10)
    paused = finished(1, 0.0, 0.0, 0.5, 1.4, output=10)
    smooth.slo = paused.slo = replace(smooth.slo, tbt=0.5)
    smooth.max_gap, paused.max_gap = 0.2, 1.2       # same mean TPOT, one stalled stream
    assert attains(paused) and not stream_attains(paused) and stream_attains(smooth)
    summary = summarize([smooth, paused])
    assert (summary.attainment, summary.stream_attainment, summary.stall_share) == (1.0, 0.5, 0.5)
    assert summary.max_gap.p50 == pytest.approx(0.7) and summary.as_dict()["ttft_max_s"] == 0.5


def test_itl_percentiles_come_from_the_gap_histogram():
    gaps = GapHistogram()
    gaps.add(0.03, 99)
    gaps.add(3.0)
    summary = summarize([finished(0, 0.0, 0.0, 0.5, 1.4, output=10)], gaps)
    assert summary.itl.p50 == pytest.approx(0.03, rel=0.07)
    assert math.isnan(summarize([]).itl.p99)


def test_each_miss_has_one_cause():
    queued = finished(0, 0.0, 0.9, 1.5, 2.4, output=10)          # waited 0.9 s, ran 0.6 s
    slow_prefill = finished(1, 0.0, 0.1, 1.5, 2.4, output=10)    # waited 0.1 s, ran 1.4 s
    slow_decode = finished(2, 0.0, 0.0, 0.5, 2.0, output=10)
    paused = finished(3, 0.0, 0.0, 0.5, 1.4, output=10)
    paused.slo, paused.max_gap = replace(paused.slo, tbt=0.5), 0.8
    failed = make_request(4)
    failed.fail(1.0, "x")
    fine = finished(5, 0.0, 0.0, 0.5, 1.4, output=10)
    causes = [miss_cause(r) for r in (queued, slow_prefill, slow_decode, paused, failed, fine)]
    assert causes == ["TTFT queueing", "TTFT execution", "TPOT", "stall", "failed", None]
