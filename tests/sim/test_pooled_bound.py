import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sim.test_simulator import cluster
from tropical.core.slo import SLOSpec
from tropical.sim.pooled_bound import PooledCluster, deadline_attainment, hit_share
from tropical.sim.run import Experiment
from tropical.workload.trace import Trace, TraceEntry


def test_a_job_alone_meets_its_deadline_at_the_servers_speed():
    assert deadline_attainment([(0.0, 2.0, 1.0)], speed=2.0) == 1.0
    assert deadline_attainment([(0.0, 2.0, 0.99)], speed=2.0) == 0.0
    assert deadline_attainment([(0.0, 2.0, 10.0)], speed=0.0) == 0.0


def test_an_urgent_arrival_preempts_a_job_with_slack():
    # the first job has until 10; the second arrives at 1 with until 2: both make it only if
    # the second runs at once and the first resumes after it
    assert deadline_attainment([(0.0, 3.0, 10.0), (1.0, 1.0, 2.0)], speed=1.0) == 1.0


def test_a_hopeless_job_yields_instead_of_sinking_the_jobs_behind_it():
    jobs = [(0.0, 5.0, 1.0), (0.0, 1.0, 2.0), (0.0, 1.0, 3.0)]
    assert deadline_attainment(jobs, speed=1.0) == pytest.approx(2 / 3)


def test_a_burst_misses_what_the_same_work_spread_out_meets():
    burst = [(0.0, 1.0, 2.0)] * 4
    spread = [(2.0 * i, 1.0, 2.0 * i + 2.0) for i in range(4)]
    assert deadline_attainment(burst, speed=1.0) == 0.5
    assert deadline_attainment(spread, speed=1.0) == 1.0
    with pytest.raises(ValueError, match="at least one job"):
        deadline_attainment([], speed=1.0)


def _fifo_meets_all(jobs: list[tuple[float, float, float]], speed: float) -> bool:
    """Arrival order meets every deadline, with a margin that rounding cannot eat."""
    now = 0.0
    for arrival, work, deadline in sorted(jobs):
        now = max(now, arrival) + work / speed
        if now > deadline - 1e-6:
            return False
    return True


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0.01, 5), st.floats(0.01, 20)),
                min_size=1, max_size=30), st.floats(0.2, 4))
def test_deadline_order_meets_every_deadline_whenever_some_schedule_does(raw, speed):
    jobs = [(arrival, work, arrival + slack) for arrival, work, slack in raw]
    share = deadline_attainment(jobs, speed)
    assert 0.0 <= share <= 1.0
    if _fifo_meets_all(jobs, speed):                       # a feasible schedule exists
        assert share == 1.0
    assert deadline_attainment(jobs, speed * 1e6) == 1.0   # all but instant: every one meets


def _experiment(entries: list[TraceEntry]) -> Experiment:
    return Experiment(Trace("t", tuple(entries)), cluster(num_workers=2, kv_tokens=100_000), "colocated",
                      slo=SLOSpec(ttft_scale=3.0, tpot_scale=5.0))


def test_on_an_even_trace_the_pooled_bound_nears_the_work_bound_and_a_bursty_one_falls_short():
    even = _experiment([TraceEntry(float(i), 2000, 20) for i in range(400)])
    bursty = _experiment([TraceEntry(float(40 * (i // 40)), 2000, 20) for i in range(400)])
    even_cluster, bursty_cluster = PooledCluster.of(even), PooledCluster.of(bursty)
    work = even_cluster.bound.rate_rps
    assert bursty_cluster.bound.rate_rps == pytest.approx(work)
    assert 0.9 * work <= even_cluster.capacity() <= work
    assert bursty_cluster.capacity() < 0.5 * work


def test_the_pooled_bound_follows_the_ttft_slo_a_lone_prompt_must_meet():
    exp = _experiment([TraceEntry(float(i), 2000, 20) for i in range(50)])
    tight = Experiment(exp.trace, exp.cluster, exp.policy, slo=SLOSpec(ttft_scale=0.5, tpot_scale=5.0))
    assert PooledCluster.of(tight).capacity() < PooledCluster.of(exp).capacity()


def test_bounds_at_given_hits_price_each_prompt_less_its_hit():
    exp = _experiment([TraceEntry(float(i), 2000, 20) for i in range(200)])
    none, half = PooledCluster.of(exp, [0] * 200), PooledCluster.of(exp, [1000] * 200)
    assert none.bound.rate_rps == pytest.approx(PooledCluster.of(exp).bound.rate_rps)
    assert half.bound.rate_rps > none.bound.rate_rps
    assert half.kserver_capacity() > none.kserver_capacity()
    assert all(h.prefill < n.prefill for h, n in zip(half.works, none.works, strict=True))


def test_a_run_s_hits_are_its_requests_cached_tokens_in_trace_order():
    from tropical.sim.run import simulate

    entries = [TraceEntry(float(i), 1100, 4, prefix_blocks=(1, 2, 3 + i)) for i in range(6)]
    run = simulate(Experiment(Trace("t", tuple(entries)), cluster(num_workers=1), "colocated"))
    by_id = {r.id: r.cached for r in run.requests}
    assert run.hits == [by_id[i] for i in sorted(by_id)]
    assert run.hits[0] == 0 and max(run.hits) > 0


def test_hit_share_is_the_hits_over_every_prompt_token():
    exp = _experiment([TraceEntry(0.0, 1000, 5), TraceEntry(1.0, 3000, 5)])
    assert hit_share(exp, [0, 0]) == 0.0
    assert hit_share(exp, [500, 1500]) == pytest.approx(0.5)
