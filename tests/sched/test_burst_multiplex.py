"""Burst-aware Path 2 (``ToggleParams.burst``): a multiplexing worker spends the slack its
decodes banked on prompts the prefill workers cannot clear in time, and no decode loses its
TPOT SLO for it."""

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.sched.test_tropical import CLUSTER, Watched, bursty
from tropical.config import SimConfig
from tropical.core.metrics import tpot
from tropical.core.request import PrefillPath
from tropical.sched.registry import PolicyParams, make_policy
from tropical.sched.tropical import ToggleParams

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
    for start, end, decoding in sim.mixed:
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
