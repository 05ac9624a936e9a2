import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sim.test_simulator import cluster
from tropical.core.kserver import bound_attainment, deadline_attainment
from tropical.core.slo import SLOSpec
from tropical.sim.pooled_bound import PooledCluster
from tropical.sim.run import Experiment
from tropical.workload.trace import Trace, TraceEntry


def test_one_long_prompt_meets_on_the_pooled_server_what_it_misses_on_one_of_k():
    job = [(0.0, 2.0, 1.5)]
    assert deadline_attainment(job, speed=2.0) == 1.0
    assert deadline_attainment(job, speed=1.0, servers=2) == 0.0


def test_k_servers_run_k_prompts_side_by_side():
    jobs = [(0.0, 1.0, 1.0), (0.0, 1.0, 1.0)]
    assert deadline_attainment(jobs, speed=1.0, servers=2) == 1.0
    assert deadline_attainment(jobs, speed=1.0) == 0.5


def test_an_urgent_arrival_preempts_one_of_the_busy_servers():
    jobs = [(0.0, 3.0, 10.0), (0.0, 3.0, 10.0), (1.0, 1.0, 2.0)]
    assert deadline_attainment(jobs, speed=1.0, servers=2) == 1.0


def test_an_urgent_arrival_waits_out_the_quantum_of_the_prompts_running():
    jobs = [(0.0, 3.0, 10.0), (0.0, 3.0, 10.0), (1.0, 1.0, 2.0)]
    assert deadline_attainment(jobs, speed=1.0, servers=2, quantum=0.0) == 1.0
    assert deadline_attainment(jobs, speed=1.0, servers=2, quantum=0.5) == 1.0    # up at 1.0: it runs
    assert deadline_attainment(jobs, speed=1.0, servers=2, quantum=2.0) == pytest.approx(2 / 3)
    assert deadline_attainment(jobs, speed=1.0, servers=2, quantum=math.inf) == pytest.approx(2 / 3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0.01, 5), st.floats(0.01, 20)),
                min_size=1, max_size=30), st.floats(0.2, 4), st.integers(1, 4))
def test_a_quantum_longer_than_every_job_is_no_preemption(raw, speed, servers):
    jobs = [(arrival, work, arrival + slack) for arrival, work, slack in raw]
    assert (deadline_attainment(jobs, speed, servers, quantum=6.0 / speed)
            == deadline_attainment(jobs, speed, servers, quantum=math.inf))


def test_a_hopeless_prompt_yields_its_server():
    jobs = [(0.0, 5.0, 1.0), (0.0, 5.0, 1.0), (0.0, 1.0, 2.0), (0.0, 1.0, 2.0)]
    assert deadline_attainment(jobs, speed=1.0, servers=2) == 0.5


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="at least one server"):
        deadline_attainment([(0.0, 1.0, 1.0)], speed=1.0, servers=0)
    with pytest.raises(ValueError, match="at least one job"):
        deadline_attainment([], speed=1.0, servers=2)
    with pytest.raises(ValueError, match="quantum of at least 0 s, got -1"):
        deadline_attainment([(0.0, 1.0, 1.0)], speed=1.0, quantum=-1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0.01, 5), st.floats(0.01, 20)),
                min_size=1, max_size=30), st.floats(0.2, 4), st.integers(1, 4))
def test_whatever_k_servers_meet_in_full_the_pooled_server_meets(raw, speed, servers):
    jobs = [(arrival, work, arrival + slack) for arrival, work, slack in raw]
    share = deadline_attainment(jobs, speed, servers)
    assert 0.0 <= share <= 1.0
    if share == 1.0:
        assert deadline_attainment(jobs, speed * servers) == 1.0


def _pooled(ttft_scale: float) -> PooledCluster:
    entries = [TraceEntry(float(i), 4000, 20) for i in range(160)]
    return PooledCluster.of(Experiment(Trace("t", tuple(entries)), cluster(num_workers=4, kv_tokens=100_000),
                                       "colocated", slo=SLOSpec(ttft_scale=ttft_scale, tpot_scale=5.0)))


def test_a_ttft_slo_below_one_workers_prefill_leaves_the_k_server_bound_nothing():
    tight, loose = _pooled(0.5), _pooled(3.0)
    assert tight.workers == 4
    assert tight.kserver_capacity() == 0 < tight.capacity()
    assert 0 < loose.kserver_capacity() <= loose.capacity() <= loose.bound.rate_rps


def test_a_prompt_bound_to_a_busy_server_waits_unless_it_preempts():
    jobs = [(0.0, 3.0, 10.0), (0.0, 3.0, 10.0), (1.0, 1.0, 2.5)]
    assert bound_attainment(jobs, speed=1.0, servers=2) == 1.0
    assert bound_attainment(jobs, speed=1.0, servers=2, preemptive=False) == pytest.approx(2 / 3)


def test_a_bound_prompt_misses_what_a_shared_queue_would_meet():
    # the urgent job goes to the server with less work left, whose running job ends too late
    # for it; from a shared queue it takes the other server, which frees first
    jobs = [(0.0, 3.0, 100.0), (0.0, 1.5, 100.0), (0.0, 2.0, 100.0), (1.0, 1.0, 2.6)]
    assert deadline_attainment(jobs, speed=1.0, servers=2, quantum=math.inf) == 1.0
    assert bound_attainment(jobs, speed=1.0, servers=2, preemptive=False) == 0.75


def test_a_prompt_bound_where_it_starts_soonest_meets_what_the_least_loaded_binding_misses():
    # server 0 runs a 3 s job to t=3; server 1 runs one to t=1.5 with a 2 s job queued behind
    # it: more work left, but the urgent job goes ahead of the queued one, in deadline order
    jobs = [(0.0, 3.0, 100.0), (0.0, 1.5, 100.0), (0.0, 2.0, 100.0), (1.0, 1.0, 2.6)]
    assert bound_attainment(jobs, speed=1.0, servers=2, preemptive=False, soonest=True) == 1.0
    assert bound_attainment(jobs, speed=1.0, servers=2, soonest=True) == 1.0


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0.01, 5), st.floats(0.01, 20)),
                min_size=1, max_size=30), st.floats(0.2, 4))
def test_one_bound_server_is_the_one_ideal_server(raw, speed):
    jobs = [(arrival, work, arrival + slack) for arrival, work, slack in raw]
    assert bound_attainment(jobs, speed, 1) == deadline_attainment(jobs, speed, 1)
    assert bound_attainment(jobs, speed, 1, preemptive=False) == deadline_attainment(jobs, speed, 1, math.inf)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0.01, 5), st.floats(0.01, 20)),
                min_size=1, max_size=30), st.floats(0.2, 4), st.integers(1, 4), st.booleans(),
       st.booleans())
def test_servers_at_a_full_share_of_the_speed_are_the_ideal_as_it_was(raw, speed, servers, preemptive,
                                                                     soonest):
    jobs = [(arrival, work, arrival + slack) for arrival, work, slack in raw]
    assert (bound_attainment(jobs, speed, servers, preemptive, soonest, [1.0] * servers)
            == bound_attainment(jobs, speed, servers, preemptive, soonest))


def test_a_server_at_half_the_speed_takes_twice_as_long_and_is_passed_over_when_idle():
    # two idle servers, the second twice as fast: the soonest binding gives it the urgent job
    # (done at 1, where the other would finish it at 2, past its deadline); the other job
    # finishes at 2 either way. At half speed every job takes 4 s and both miss.
    jobs = [(0.0, 2.0, 1.2), (0.0, 2.0, 2.5)]
    assert bound_attainment(jobs, 1.0, 2, soonest=True, shares=[1.0, 2.0]) == 1.0
    assert bound_attainment(jobs, 1.0, 2, soonest=True, shares=[0.5, 0.5]) == 0.0
    assert bound_attainment([(0.0, 1.0, 1.5)], 1.0, 1, shares=[0.5]) == 0.0
    assert bound_attainment([(0.0, 1.0, 2.0)], 1.0, 1, shares=[0.5]) == 1.0


def test_speed_shares_are_one_positive_share_per_server():
    with pytest.raises(ValueError, match=r"one positive speed share per server \(2\), got \[1.0\]"):
        bound_attainment([(0.0, 1.0, 1.0)], 1.0, 2, shares=[1.0])
    with pytest.raises(ValueError, match="positive speed share"):
        bound_attainment([(0.0, 1.0, 1.0)], 1.0, 2, shares=[1.0, 0.0])


def test_the_ideals_capacities_fall_as_they_bind_prompts_and_stop_preempting():
    """A long prompt every fourth arrival: short prompts behind one it runs to its end miss."""
    entries = [TraceEntry(i * 0.5, 16000 if i % 4 == 0 else 300, 20) for i in range(160)]
    fleet = cluster(num_workers=4, kv_tokens=100_000)
    pooled = PooledCluster.of(Experiment(Trace("t", tuple(entries)), fleet, "colocated",
                                         slo=SLOSpec(ttft_scale=3.0, tpot_scale=5.0)))
    ideals = pooled.ideal_capacities()
    assert ideals["k servers"] == pooled.kserver_capacity()
    rate = ideals["k servers"]
    assert pooled.servers_attainment(rate, pooled.workers) == pooled.attainment(rate, pooled.workers)
    assert ideals["k servers, never preempted"] < ideals["k servers"]
    assert ideals["k servers, bound at arrival, never preempted"] < ideals["k servers, bound at arrival"]
    assert all(0 < rate <= pooled.bound.rate_rps for rate in ideals.values())
