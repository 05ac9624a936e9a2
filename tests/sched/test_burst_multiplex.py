"""Knobs for bursts: burst-aware Path 2 (``ToggleParams.burst``: a multiplexing worker spends
the slack its decodes banked on prompts the prefill workers cannot clear in time, and no decode
loses its TPOT SLO for it) and the prefill workers' batch (``ToggleParams.prefill_budget``)."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.sched.test_tropical import CLUSTER, Watched, bursty
from tropical.config import SimConfig
from tropical.core.metrics import tpot
from tropical.core.request import PrefillPath
from tropical.sched.registry import PolicyParams, make_policy
from tropical.sched.rules import Role
from tropical.sched.tropical import ToggleParams
from tropical.sim.simulator import Simulator

prompts = st.lists(st.tuples(st.integers(500, 6000), st.integers(20, 80)), min_size=20, max_size=60)


def watched(lengths: list[tuple[int, int]], burst: bool) -> tuple[Watched, list]:
    policy = make_policy("tropical+", PolicyParams(toggle=ToggleParams(burst=burst)))
    sim = Watched(CLUSTER.build(policy), policy, bursty(lengths, gap=0.005))
    return sim, sim.run()


def stretched(sim: Watched) -> list[bool]:
    """For each mixed iteration: did it run longer than some decode's TPOT SLO there?"""
    return [any(end - start > req.slo.tpot * (1 + 1e-9) for req, _ in decoding)
            for start, end, decoding in sim.mixed]


@settings(max_examples=25, deadline=None)
@given(prompts)
def test_burst_multiplexing_spends_only_the_slack_decodes_banked(lengths):
    """Every mixed iteration ends by each decode's tokens x TPOT SLO since its first token, so
    every request that decoded beside a multiplexed chunk ends within its TPOT SLO."""
    sim, done = watched(lengths, burst=True)
    assume(sim.mixed)
    for _, end, decoding in sim.mixed:
        for req, generated in decoding:
            assert end - req.first_token <= generated * req.slo.tpot * (1 + 1e-9)
    beside = {req.id for _, _, decoding in sim.mixed for req, _ in decoding}
    assert all(tpot(r) <= r.slo.tpot * (1 + 1e-9) for r in done if r.id in beside)


def test_a_burst_stretches_iterations_past_the_tpot_slo_only_with_the_knob():
    """The same burst: without the knob no mixed iteration outlasts a decode's TPOT SLO (the
    per-iteration rule); with it some do, on slack banked by the decodes' fast tokens."""
    lengths = [(3000, 60)] * 12 + [(4000, 40)] * 30
    off, _ = watched(lengths, burst=False)
    on, done = watched(lengths, burst=True)
    assert off.mixed and not any(stretched(off))
    assert any(stretched(on))
    assert any(r.path is PrefillPath.MULTIPLEX for r in done)


def test_the_knob_is_off_by_default_and_set_by_its_flag():
    assert not SimConfig().policy_params().toggle.burst
    assert SimConfig().updated({"burst_multiplex": True}, "test").policy_params().toggle.burst


class PrefillBatches(Simulator):
    """Records how many prompts each prefill worker's iteration holds."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sizes: list[int] = []
        self._seen: set[int] = set()

    def _start(self, worker):
        super()._start(worker)
        flight = self._flights.get(worker.id)
        if flight is not None and flight.version not in self._seen and worker.role is Role.PREFILL:
            self._seen.add(flight.version)
            self.sizes.append(len(flight.batch.prefills))


def prefill_batches(budget: int | None) -> list[int]:
    policy = make_policy("tropical+", PolicyParams(toggle=ToggleParams(prefill_budget=budget)))
    sim = PrefillBatches(CLUSTER.build(policy), policy, bursty([(300, 5)] * 60, gap=0.001))
    sim.run()
    return sim.sizes


def test_a_small_prefill_budget_runs_prompts_one_at_a_time():
    """A burst of short prompts: batched by default, one per iteration under a 1-token budget
    (a lone prompt may exceed the budget, so every prompt still runs)."""
    assert max(prefill_batches(None)) > 1
    one = prefill_batches(1)
    assert one and max(one) == 1


def test_the_prefill_budget_is_checked_and_set_by_its_flag():
    with pytest.raises(ValueError, match="prefill_budget"):
        ToggleParams(prefill_budget=0)
    assert SimConfig().policy_params().toggle.prefill_budget is None
    config = SimConfig().updated({"prefill_batch_tokens": 1024}, "test")
    assert config.policy_params().toggle.prefill_budget == 1024
