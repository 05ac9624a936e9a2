import pytest

from tests.factories import linear_model, make_request
from tests.sim.test_simulator import cluster
from tropical.core.latency.iterations import decode_time, prefill_time
from tropical.core.slo import SLO
from tropical.sim.bound import full_batch, queued_work, request_work, tpot_batch, unwaited_work, work_bound
from tropical.workload.trace import Trace, TraceEntry


def test_request_work_is_its_prefill_plus_its_share_of_full_batches():
    model = linear_model()
    work = request_work(model, prompt=1000, output=11, batch=10)
    intercept, slope = model.decode_line(10)
    assert work.prefill == pytest.approx(prefill_time(model, 1000))
    assert work.decode == pytest.approx(10 * (intercept / 10 + slope * (1000 + 5.5)))


def test_bound_is_workers_over_mean_work_with_the_batch_kv_allows():
    trace = Trace("t", tuple(TraceEntry(float(i), 1000, 11) for i in range(4)))
    assert full_batch(trace, kv_tokens=10_100, max_seqs=256) == 10
    bound = work_bound(trace, cluster(num_workers=2, kv_tokens=10_100), max_seqs=256)
    per_request = request_work(linear_model(), 1000, 11, 10).total
    assert bound.rate_rps == pytest.approx(2 / per_request)
    assert bound.share(bound.rate_rps / 2) == pytest.approx(0.5)


def test_queued_work_counts_what_is_left_of_each_phase():
    model = linear_model()
    done, half, untouched = make_request(0), make_request(1), make_request(2)
    done.prefill_start, done.first_token, done.finish = 0.0, 1.0, 2.0
    half.prefill_start, half.first_token, half.finish = 0.0, 1.0, 3.0     # decode half done at 2
    work = request_work(model, 100, 10, 4)
    left, total = queued_work([done, half, untouched], model, 4, at=2.0)
    assert total == pytest.approx(3 * work.total)
    assert left == pytest.approx(work.decode / 2 + work.total)


def test_unwaited_work_prices_each_request_served_from_its_arrival():
    """Had nobody waited: a request that arrived long ago is done, one arriving now has all its
    work ahead, and one halfway through its prefill alone has half of that and all its decode."""
    model = linear_model()
    work = request_work(model, 100, 10, 4)
    old, now, halfway = make_request(0, arrival=0.0), make_request(1, arrival=50.0), make_request(2)
    halfway.arrival = 50.0 - work.prefill / 2
    left = unwaited_work([old, now, halfway], model, 4, at=50.0)
    assert left == pytest.approx(work.total + work.prefill / 2 + work.decode)


def test_waiting_adds_to_the_queued_work_never_to_the_unwaited():
    """The same request, served at once or after a wait: the unwaited work is the same, and
    the one that waited has more queued when it is priced."""
    model = linear_model()
    work = request_work(model, 100, 10, 4)
    prompt_end = work.prefill
    served, waited = make_request(0), make_request(1)
    served.prefill_start, served.first_token, served.finish = 0.0, prompt_end, prompt_end + 1.0
    waited.prefill_start, waited.first_token, waited.finish = 1.0, 1.0 + prompt_end, 2.0 + prompt_end
    at = prompt_end / 2
    assert unwaited_work([served], model, 4, at) == unwaited_work([waited], model, 4, at)
    assert queued_work([waited], model, 4, at)[0] > queued_work([served], model, 4, at)[0]


def test_tpot_batch_is_the_largest_batch_whose_iteration_keeps_the_slo():
    model = linear_model()
    most = 64
    slo = decode_time(model, 10, 10 * 2000)
    assert tpot_batch(model, slo, 2000, most) == 10
    assert tpot_batch(model, slo * 1e6, 2000, most) == most        # the KV's batch caps it
    assert tpot_batch(model, 0.0, 2000, most) == 1                  # even alone it misses


def test_a_tight_tpot_slo_lowers_the_bound_and_a_loose_one_leaves_it():
    trace = Trace("t", tuple(TraceEntry(float(i), 1000, 11) for i in range(4)))
    spec = cluster(num_workers=2, kv_tokens=10_100)
    free = work_bound(trace, spec, max_seqs=256)
    model = linear_model()
    tight = decode_time(model, 3, int(3 * (1000 + 5.5)))
    loose = work_bound(trace, spec, 256, [SLO(ttft=1.0, tpot=1e3)] * 4)
    bound = work_bound(trace, spec, 256, [SLO(ttft=1.0, tpot=tight)] * 4)
    assert loose.rate_rps == pytest.approx(free.rate_rps) and loose.batch == 10
    assert bound.batch == 3
    assert bound.rate_rps == pytest.approx(2 / request_work(model, 1000, 11, 3).total)
    with pytest.raises(ValueError, match="one SLO per request: 1 for 4"):
        work_bound(trace, spec, 256, [SLO(ttft=1.0, tpot=1.0)])
