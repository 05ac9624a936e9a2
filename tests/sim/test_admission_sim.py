"""Admission in whole simulated runs: refusals cost nothing, count as misses, and change nothing
when admission is off."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.factories import linear_model, make_request
from tropical.config import SimConfig
from tropical.core.metrics import attains, summarize, tpot
from tropical.core.request import Request
from tropical.core.specs import ReplicaSpec, hardware
from tropical.models import load_model_spec
from tropical.sched.registry import PolicyParams, make_policy
from tropical.sched.rejection import REASONS, AdmissionMode
from tropical.sched.tropical import ToggleParams
from tropical.sched.worker import WorkerState
from tropical.sim.build import experiment
from tropical.sim.cluster import ClusterSpec, WorkerSpec
from tropical.sim.overload import overload
from tropical.sim.run import simulate
from tropical.sim.simulator import Simulator

REPLICA = ReplicaSpec(load_model_spec("llama-2-7b"), hardware("a100"), tp=1)
POLICIES = ("colocated", "chunked-512", "disagg", "kv-router", "tropical", "tropical+")
ADMITTING = (AdmissionMode.EARLY_REJECT, AdmissionMode.PREDICTIVE)


def run(policy: str, mode: AdmissionMode, requests: list[Request], workers: int = 2,
        toggle: ToggleParams | None = None) -> Simulator:
    chosen = make_policy(policy, PolicyParams(admission=mode, toggle=toggle or ToggleParams()))
    spec = ClusterSpec("test", (WorkerSpec(REPLICA, linear_model(), 50_000),) * workers)
    sim = Simulator(spec.build(chosen), chosen, requests)
    sim.run()
    return sim


def flood(count: int = 120) -> list[Request]:
    """Twice as much work as two workers clear in time: prompts of 1,000-3,000 tokens every 50 ms
    (0.11-0.31 s of prefill each) with 1 s TTFT SLOs."""
    return [make_request(i, arrival=0.05 * i, prompt=1000 + 1000 * (i % 3), output=20, ttft=1.0)
            for i in range(count)]


@pytest.mark.parametrize("mode", ADMITTING)
@pytest.mark.parametrize("policy", POLICIES)
def test_a_refused_request_never_held_kv_nor_ran_a_token(policy, mode, monkeypatch):
    held, ran = set(), set()
    reserve, complete = WorkerState.reserve, WorkerState.complete_prefill

    def watch_reserve(self, req):
        if reserve(self, req):
            held.add(req.id)
            return True
        return False

    def watch_complete(self, req, new, now):
        ran.add(req.id)
        return complete(self, req, new, now)

    monkeypatch.setattr(WorkerState, "reserve", watch_reserve)
    monkeypatch.setattr(WorkerState, "complete_prefill", watch_complete)
    requests = flood()
    sim = run(policy, mode, requests)
    refused = [r for r in requests if r.rejected is not None]
    assert refused, "an overload this deep refuses some requests"
    for req in refused:
        assert req.id not in held and req.id not in ran and req.rejected in REASONS
        assert req.prefill_start is None and req.first_token is None and req.generated == 0
        assert req.computed == 0 and req.error is not None and not attains(req)
    assert all(w.kv.used_blocks == 0 and not w.waiting and not w.running for w in sim.workers)
    admitted = [r for r in requests if r.rejected is None]
    assert all(r.error is None and r.generated == r.output_len for r in admitted)


def test_refusals_are_misses_over_every_arrival_and_counted_by_reason():
    requests = flood()
    run("tropical+", AdmissionMode.EARLY_REJECT, requests)
    summary = summarize(requests)
    refused = [r for r in requests if r.rejected is not None]
    assert sum(summary.rejected.values()) == len(refused) and summary.requests == len(requests)
    assert summary.rejection_rate == pytest.approx(len(refused) / len(requests))
    assert summary.attainment == pytest.approx(sum(map(attains, requests)) / len(requests))
    flat = summary.as_dict()
    assert flat["rejected"] == summary.rejected and flat["rejection_rate"] == summary.rejection_rate


def attained_in_flood(toggle: ToggleParams) -> dict[AdmissionMode, int]:
    attained = {}
    for mode in AdmissionMode:
        requests = flood()
        run("tropical+", mode, requests, toggle=toggle)
        attained[mode] = sum(map(attains, requests))
    return attained


def test_admission_lifts_goodput_past_capacity_where_doomed_prompts_keep_their_place():
    """Admitting everything to a toggle that does not demote, most requests wait behind others
    that miss too (the toggle as it was measured: nor does it spare the prompts an iteration
    finishes, which alone lifts admitting everything here from 12 to 16 in time, nor price Path 2
    beside the decodes its queued prompts become)."""
    attained = attained_in_flood(ToggleParams(demote_doomed=False, spare_finishing=False,
                                              joining_decodes=False))
    assert attained[AdmissionMode.EARLY_REJECT] > 2 * attained[AdmissionMode.NONE]


def test_under_demotion_refusing_early_serves_about_as_many_in_time():
    """``tropical+`` demotes doomed prompts by default: admitting everything, they wait behind
    the rest instead of delaying it, so the flood's goodput no longer collapses (measured: 29
    of 120 in time, 16 without demotion, against 27 refusing early; refusal's gain is answering
    at once, before any work)."""
    attained = attained_in_flood(ToggleParams())
    assert attained[AdmissionMode.NONE] > 1.5 * attained_in_flood(
        ToggleParams(demote_doomed=False))[AdmissionMode.NONE]
    assert attained[AdmissionMode.EARLY_REJECT] >= attained[AdmissionMode.NONE] - 3


def test_early_rejection_leaves_the_prompts_a_later_round_saves_to_it():
    """Synthetic's shortest prompts have its tightest TTFT SLOs (about 0.1 s); at arrival no
    multiplexing worker may take one, yet a round at a multiplexing worker's next iteration end
    does. Refusing each prompt late on Path 1 refused them (measured on these 600 requests:
    74.7% in time against 96.0% admitting everything, 122 prompts of at most 100 tokens
    refused); asking ``tropical+``'s floor on a later round first refuses few of them."""
    runs = {mode: simulate(experiment(SimConfig(trace="synthetic", limit=600, admission=mode).with_preset())
                           .with_policy("tropical+").at_rate(0.6))
            for mode in ("none", "early-reject")}
    short = [r for r in runs["early-reject"].requests if r.rejected and r.prompt_len <= 100]
    assert runs["early-reject"].summary.attainment >= runs["none"].summary.attainment
    assert len(short) < 10


PUBLISHED = {  # attainment, stream attainment, P90 TTFT (s), P90 TPOT (s) before admission existed (996d3fc),
    # tropical+ with the defaults it had then (no demotion, 4,096-token prefill batches, no
    # finishing prompt spared, Path 1 by least work, Path 2 at arrival whatever waits)
    "tropical+": (0.34, 0.34, 69.627008493, 0.102180213),
    "chunked-512": (0.07333333333333333, 0.07333333333333333, 121.741650509, 0.116232365),
    "disagg": (0.056666666666666664, 0.056666666666666664, 229.874275995, 0.028939828),
}


@pytest.mark.parametrize("policy", sorted(PUBLISHED))
def test_admission_none_reproduces_the_figures_from_before_it_existed(policy):
    """The conversation trace's first 300 requests on the paper cluster at 1.5x their rate."""
    config = SimConfig(limit=300, admission="none", demote_doomed=False, prefill_batch_tokens=4096,
                       spare_finishing=False, placed_dispatch=False, size_weight=-1.0,
                       prefill_piece_tokens=0, shorter_first=False, iteration_cap=False,
                       joining_decodes=False)
    exp = experiment(config.with_preset())
    s = simulate(exp.with_policy(policy).at_rate(1.5)).summary
    assert (s.attainment, s.stream_attainment, s.ttft.p90, s.tpot.p90) == pytest.approx(PUBLISHED[policy])
    assert s.rejected == {}


def test_overload_reports_every_policy_and_mode_as_a_share_of_the_bound():
    exp = experiment(replace(SimConfig().with_preset(), limit=60))
    past = overload(exp, ["chunked-512", "tropical+"], bound_rps=1.0, processes=1, progress=None)
    shares = past.shares()
    assert set(shares) == {"chunked-512", "tropical+"}
    for policy, modes in shares.items():
        assert set(modes) == {"none", "early-reject", "predictive"}
        for mode, by_rate in modes.items():
            assert set(by_rate) == {"1.5", "2.0"}
            assert by_rate["1.5"] == past.points[policy][mode][1.5].goodput_rps
    assert past.as_dict()["runs"]["tropical+"]["none"]["2.0"]["rejected"] == {}


spans = st.lists(st.tuples(st.integers(200, 3000), st.integers(2, 40), st.floats(0.0, 0.2)),
                 min_size=1, max_size=25)


@pytest.mark.parametrize("policy", ("colocated", "chunked-512"))
@settings(max_examples=30, deadline=None)
@given(spans, st.floats(0.006, 0.03))
@example([(899, 2, 0.0)], 0.006)
def test_predictive_admission_keeps_the_tpot_of_the_last_arrival(policy, workload, slo):
    """Once the last request is admitted no more load comes: everything that will decode beside
    it was known, so under predictive admission it meets its TPOT SLO (exact predictor), up to
    the rounding of its timestamps: a lone decode admitted at the SLO's edge (899-token prompt, 2
    tokens out, 6 ms) measured 0.006000000000000005 s between two absolute times."""
    requests, clock = [], 0.0
    for i, (prompt, output, gap) in enumerate(workload):
        clock += gap
        requests.append(make_request(i, arrival=clock, prompt=prompt, output=output, ttft=100.0, tpot=slo))
    run(policy, AdmissionMode.PREDICTIVE, requests, workers=1)
    last = max(requests, key=lambda r: (r.arrival, r.id))
    if last.rejected is None and last.output_len > 1:
        assert tpot(last) <= last.slo.tpot * (1 + 1e-12)
