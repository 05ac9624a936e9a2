import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sim.test_simulator import cluster
from tropical.core.kserver import deadline_attainment
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
