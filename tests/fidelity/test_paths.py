"""Path by path: the server's x-tropical-path header against the twin's decision for the same request."""

from __future__ import annotations

import math

from tests.factories import make_request
from tropical.bench.record import Measurement
from tropical.core.request import PrefillPath, Request
from tropical.fidelity.paths import PathComparison, compare_paths, merge


def twin_request(rid: int, arrival: float, path: PrefillPath, worker: int, reason: str = "") -> Request:
    req = make_request(rid, arrival)
    req.path, req.prefill_worker, req.reason = path, worker, reason
    return req


def measured(rid: int, path: str | None, worker: str | None = "0", reason: str | None = None) -> Measurement:
    return Measurement(rid, 100, 10, path=path, prefill_worker=worker, reason=reason)


def test_agreement_counts_requests_with_a_path_header_and_names_the_earliest_divergence() -> None:
    twin = [twin_request(0, 0.0, PrefillPath.PREFILL_WORKER, 0),
            twin_request(1, 2.0, PrefillPath.MULTIPLEX, 1, "fits TPOT slack on worker 1"),
            twin_request(2, 1.0, PrefillPath.FALLBACK, 0, "no worker meets TTFT"),
            twin_request(3, 3.0, PrefillPath.PREFILL_WORKER, 0)]
    real = [measured(0, "prefill"), measured(1, "prefill"), measured(2, "multiplex", "1", "multiplexed"),
            measured(3, None)]
    result = compare_paths(real, twin)
    assert (result.compared, result.same) == (3, 1) and math.isclose(result.agreement, 1 / 3)
    first = result.first_divergence
    assert first is not None
    assert (first.id, first.real_path, first.real_prefill_worker) == (2, "multiplex", "1")
    assert (first.sim_path, first.sim_prefill_worker) == ("fallback", 0)
    assert (first.real_reason, first.sim_reason) == ("multiplexed", "no worker meets TTFT")


def test_identical_paths_have_no_divergence_and_no_headers_no_share() -> None:
    twin = [twin_request(0, 0.0, PrefillPath.COLOCATED, 1)]
    assert compare_paths([measured(0, "colocated", "1")], twin) == PathComparison(1, 1, None)
    assert math.isnan(compare_paths([measured(0, None)], twin).agreement)
    assert compare_paths([measured(0, None)], twin).as_dict()["path_agreement"] is None


def test_merge_sums_counts_and_keeps_the_earliest_divergence() -> None:
    early = compare_paths([measured(5, "prefill")], [twin_request(5, 1.0, PrefillPath.MULTIPLEX, 1)])
    late = compare_paths([measured(7, "prefill")], [twin_request(7, 4.0, PrefillPath.MULTIPLEX, 1)])
    agree = PathComparison(4, 4, None)
    merged = merge([late, agree, early])
    assert (merged.compared, merged.same) == (6, 4)
    assert merged.first_divergence == early.first_divergence
