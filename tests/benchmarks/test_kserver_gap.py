import pytest

from tests.benchmarks.scripts import load

gap = load("kserver_gap")


def test_an_attainment_is_worth_the_ideal_servers_around_it_interpolated():
    ideal = [0.5, 0.8, 0.9, 0.95]
    assert gap.worth_servers(0.8, ideal) == pytest.approx(2.0)
    assert gap.worth_servers(0.65, ideal) == pytest.approx(1.5)
    assert gap.worth_servers(0.25, ideal) == pytest.approx(0.5)     # from none, which meet nothing
    assert gap.worth_servers(0.99, ideal) == 4.0
    assert gap.worth_servers(0.9, [0.9, 0.9]) == 1.0                # a flat step: the fewest servers


def test_speed_shares_are_each_worker_s_prefill_rate_over_the_fastest():
    from tropical.sim.simulator import WorkerStats

    stats = [WorkerStats(busy=10.0, prefill_busy=4.0, prefill_tokens=40_000),
             WorkerStats(busy=10.0, prefill_busy=2.0, prefill_tokens=10_000)]
    assert gap.speed_shares(stats) == [1.0, 0.5]
    assert gap.speed_shares([*stats, WorkerStats(busy=3.0)]) is None


def test_the_decomposition_sets_the_policy_beside_part_of_the_ideal():
    from tropical.config import SimConfig
    from tropical.sim.build import experiment
    from tropical.sim.pooled_bound import PooledCluster

    pooled = PooledCluster.of(experiment(SimConfig(trace="azure-code", limit=300).with_preset()))
    at = gap.decompose(pooled, 2.0, 60.0, 0.1)
    ideal = at["ideal_servers_ttft_attainment"]
    assert len(ideal) == pooled.workers and ideal[-1] == at["kserver_ttft_attainment"]
    assert ideal == sorted(ideal)
    assert 0.0 <= at["worth_servers"] <= pooled.workers
    assert at["ttft_attainment"] >= at["attainment"]
    assert 0.0 <= at["kserver_bound_no_preemption_ttft_attainment"] <= 1.0
    shares = at["speed_shares"]
    assert len(shares) == pooled.workers and max(shares) == 1.0 and min(shares) > 0
    assert 0.0 <= at["kserver_soonest_measured_speeds_ttft_attainment"] <= 1.0
    text = gap.decomposed_markdown("a rate", at)
    assert "never preempted" in text and "bound at arrival, never preempted" in text
    assert "measured prefill speed (" + ", ".join(f"{share:.2f}" for share in shares) in text
    study = {"trace": "azure-code", "requests": 300, "workers": pooled.workers, "bound_rps": 9.0,
             "pooled_bound_rps": 4.0, "kserver_bound_rps": 4.0, "ideal_prefix_hit_rate": 0.0,
             "capacity_rps": {"tropical+": 2.0}, "decomposed": {},
             "at_own_reuse": {"tropical+": {"prefix_hit_rate": 0.1, "bound_rps": 3.0,
                                            "kserver_bound_rps": 2.5}},
             "ideal_capacity_rps": {"k servers": 4.0, "k servers, bound at arrival, never preempted": 2.5}}
    row = next(line for line in gap.markdown(study).splitlines()
               if line.startswith("k servers, bound at arrival, never preempted"))
    assert row.split()[-2:] == ["2.500", "80%"]
    own = [line for line in gap.markdown(study).splitlines() if line.startswith("tropical+  ")][1]
    assert own.split()[-4:] == ["10.0%", "3.000", "2.500", "80%"]


def test_the_bounds_at_a_policy_s_own_reuse_lie_between_none_and_the_ideal_cache_s():
    from tropical.config import SimConfig
    from tropical.sim.build import experiment
    from tropical.sim.pooled_bound import PooledCluster

    exp = experiment(SimConfig(trace="conversation", limit=300).with_preset()).with_policy("tropical+")
    own = gap.own_reuse(exp, 0.5)
    ideal = PooledCluster.of(exp)
    cold = PooledCluster.of(exp, [0] * len(exp.trace))
    assert 0.0 < own["prefix_hit_rate"] < 0.5
    assert cold.bound.rate_rps < own["bound_rps"] < ideal.bound.rate_rps
    assert own["kserver_bound_rps"] <= own["bound_rps"]


def test_the_bounds_at_the_cluster_s_kv_lie_between_none_and_the_unbounded_cache_s():
    from tropical.config import SimConfig
    from tropical.sim.build import experiment
    from tropical.sim.pooled_bound import PooledCluster

    exp = experiment(SimConfig(trace="conversation", limit=300).with_preset())
    at = gap.at_cluster_kv(exp)
    ideal, cold = PooledCluster.of(exp), PooledCluster.of(exp, [0] * len(exp.trace))
    assert set(at) == set(gap.CLUSTER_KV_CACHES)
    assert at["kv_lru"]["prefix_hit_rate"] <= at["kv"]["prefix_hit_rate"]
    for o in at.values():
        assert cold.bound.rate_rps <= o["bound_rps"] <= ideal.bound.rate_rps
        assert o["kserver_bound_rps"] <= o["bound_rps"]
    assert gap.at_cluster_kv(exp.with_prefix_cache(False)) == {}
    study = {"capacity_rps": {"tropical+": 2.0, "kv-router": 1.0},
             "at_cluster_kv": {"kv": {"prefix_hit_rate": 0.5, "bound_rps": 5.0, "kserver_bound_rps": 4.0}}}
    row = gap.cluster_kv_markdown(study)[-1].splitlines()[-1]
    assert row.split()[-5:] == ["50.0%", "5.000", "4.000", "50%", "25%"]
    assert gap.cluster_kv_markdown({"capacity_rps": {}, "at_cluster_kv": {}}) == []
    none = {"kv": {"prefix_hit_rate": 0.0, "bound_rps": 5.0, "kserver_bound_rps": 4.0}}
    assert gap.cluster_kv_markdown({"capacity_rps": {"tropical+": 2.0}, "at_cluster_kv": none}) == []
