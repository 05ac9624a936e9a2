"""The multiplexing toggle's guarantees, checked on simulated workloads with exact predictors."""

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.factories import linear_model, make_request, make_worker, start_decoding
from tropical.config import SimConfig
from tropical.core.latency.shape import BatchShape
from tropical.core.metrics import summarize, tpot
from tropical.core.request import PrefillPath
from tropical.core.specs import ReplicaSpec, hardware
from tropical.models import load_model_spec
from tropical.sched.registry import PolicyParams, make_policy
from tropical.sched.rules import Role
from tropical.sched.slack import Decoding, SlackRule, TpotBudget, largest_chunk
from tropical.sched.tropical import ToggleParams, TropicalPolicy
from tropical.sim.build import experiment
from tropical.sim.cluster import ClusterSpec, WorkerSpec
from tropical.sim.run import simulate as simulate_experiment
from tropical.sim.simulator import Simulator

REPLICA = ReplicaSpec(load_model_spec("llama-2-7b"), hardware("a100"), tp=1)
CLUSTER = ClusterSpec("t", (WorkerSpec(REPLICA, linear_model(), 60_000),) * 4)


def bursty(spans, gap=0.02):
    """Requests with SLOs at 5x their light-load latency on the test model."""
    model = linear_model()
    out = []
    for i, (prompt, output) in enumerate(spans):
        ttft = 5 * model.iteration_time(replace(_shape(prompt)))
        tpot_slo = 5 * (model.decode_line(1)[0] + model.decode_line(1)[1] * prompt)
        out.append(make_request(i, arrival=gap * i, prompt=prompt, output=output, ttft=ttft, tpot=tpot_slo))
    return out


def _shape(prompt):
    from tropical.core.latency.shape import BatchShape
    return BatchShape.prefill(prompt)


def simulate(name, requests, **params):
    policy = make_policy(name, PolicyParams(toggle=ToggleParams(**params)))
    sim = Simulator(CLUSTER.build(policy), policy, requests)
    return sim, sim.run()


spans = st.lists(st.tuples(st.integers(16, 4000), st.integers(2, 80)), min_size=5, max_size=60)


class Watched(Simulator):
    """Records every iteration in which a multiplexing worker runs a Path 2 prefill, and the
    length of every decode run that holds a prompt back."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mixed = []
        self.held = []
        self._seen = set()

    def _start(self, worker):
        super()._start(worker)
        flight = self._flights.get(worker.id)
        if flight is None or flight.version in self._seen or worker.role is not Role.MULTIPLEX:
            return
        self._seen.add(flight.version)
        if flight.batch.held:
            self.held.append(flight.run.steps)
        if any(r.path is PrefillPath.MULTIPLEX for r, _, _ in flight.batch.prefills):
            decoding = [(r, worker.generated(r)) for r in worker.running.values()]
            self.mixed.append((flight.start, flight.end, decoding))


class Recording:
    """Delegates to a policy and notes the KV usage each Path 2 admission leads to."""

    def __init__(self, inner):
        self.inner, self.usage = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _note(self, assignments, workers):
        for a in assignments:
            if a.path is PrefillPath.MULTIPLEX:
                w = workers[a.worker_id]
                pending = [r for r in w.queued() if r.id not in w.holds] + [a.request]
                blocks = w.kv.used_blocks + sum(w.kv.blocks_for(r.kv_tokens) for r in pending)
                self.usage.append(blocks / w.kv.capacity_blocks)
        return assignments

    def on_arrival(self, req, now, workers):
        return self._note(self.inner.on_arrival(req, now, workers), workers)

    def on_iteration_end(self, worker, now, workers):
        return self._note(self.inner.on_iteration_end(worker, now, workers), workers)


@settings(max_examples=30, deadline=None)
@given(spans, st.sampled_from(list(SlackRule)))
def test_path2_never_breaks_tpot_with_exact_predictor(lengths, rule):
    policy = make_policy("tropical", PolicyParams(toggle=ToggleParams(slack=rule)))
    sim = Watched(CLUSTER.build(policy), policy, bursty(lengths))
    sim.run()
    assume(sim.mixed)
    for start, end, decoding in sim.mixed:
        for req, generated in decoding:
            if rule is SlackRule.ITERATION:
                assert end - start <= req.slo.tpot * (1 + 1e-9)
            else:
                assert end - req.first_token <= generated * req.slo.tpot * (1 + 1e-9)
    if rule is SlackRule.ITERATION:  # banked slack may be spent to the last bit: no final margin
        stretched = {req.id: req for _, _, decoding in sim.mixed for req, _ in decoding}
        assert all(tpot(req) <= req.slo.tpot * (1 + 1e-9) for req in stretched.values())


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(16, 200), st.integers(20, 100)), min_size=15, max_size=30))
def test_path2_admission_never_crosses_the_watermark(short):
    """Each short prompt queues behind a long one on 8,000-token workers: the long ones decode
    on the multiplexing workers and fill their KV while the short ones' TTFT is at risk, so
    Path 2 is asked for room near the watermark, and the watermark must turn some away."""
    from tropical.sched.kv import KVPool
    cluster = ClusterSpec("t", (WorkerSpec(REPLICA, linear_model(), 8000),) * 4)
    lengths = [span for i, s in enumerate(short) for span in ((3000 + 331 * i % 1000, 60), s)]
    policy = Recording(make_policy("tropical", PolicyParams(toggle=ToggleParams(watermark=0.5))))
    refused, fits = [], KVPool.fits

    def watched(pool: KVPool, tokens: int, watermark: float = 1.0, *rest: int) -> bool:
        ok = fits(pool, tokens, watermark, *rest)
        refused.append(not ok and fits(pool, tokens, 1.0, *rest))
        return ok

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(KVPool, "fits", watched)
        Simulator(cluster.build(policy), policy, bursty(lengths, gap=0.005)).run()
    assert all(usage <= 0.5 + 1e-9 for usage in policy.usage)
    assert any(refused) and max(policy.usage) > 0.4  # pressed: the watermark, not a full pool, said no


@pytest.mark.parametrize("name", ["tropical", "tropical+"])
def test_every_decision_is_recorded_and_nothing_starves(name):
    requests = bursty([(200 + (97 * i) % 3500, 2 + (13 * i) % 60) for i in range(150)], gap=0.01)
    _, done = simulate(name, requests)
    assert all(r.path is not PrefillPath.NONE and r.reason for r in done)
    assert all(r.error is None and r.generated == r.output_len for r in done)
    assert {r.path for r in done} >= {PrefillPath.PREFILL_WORKER, PrefillPath.MULTIPLEX}


def test_zero_multiplexing_capacity_behaves_like_disagg():
    lengths = [(300 + (131 * i) % 3000, 2 + (17 * i) % 50) for i in range(120)]
    _, toggle = simulate("tropical", bursty(lengths), watermark=0.0)
    _, disagg = simulate("disagg", bursty(lengths))
    assert all(r.path in (PrefillPath.PREFILL_WORKER, PrefillPath.FALLBACK) for r in toggle)
    assert all(r.prefill_worker in (0, 1) and r.decode_worker in (2, 3) for r in toggle)
    a, b = summarize(toggle), summarize(disagg)
    assert a.attainment == pytest.approx(b.attainment, abs=0.05)
    assert a.ttft.p50 == pytest.approx(b.ttft.p50, rel=0.1)


def test_iteration_rule_bounds_the_stretched_iteration():
    worker = make_worker(Role.MULTIPLEX)
    req = make_request(output=20, tpot=0.05)
    start_decoding(worker, req)
    budget = TpotBudget.of([Decoding(req, worker.generated(req), req.first_token)])
    assert budget.fits(0.05, start=0.0, rule=SlackRule.ITERATION)
    assert not budget.fits(0.051, start=0.0, rule=SlackRule.ITERATION)


def test_banked_rule_spends_time_saved_so_far():
    worker = make_worker(Role.MULTIPLEX)
    req = make_request(output=20, tpot=0.05)
    start_decoding(worker, req)
    worker.advance_decodes(9, now=0.1)              # 10 tokens in 0.1 s: 0.4 s of budget left
    assert worker.generated(req) == 10
    budget = TpotBudget.of([Decoding(req, worker.generated(req), req.first_token)])
    assert budget.fits(0.4, start=0.1, rule=SlackRule.BANKED)
    assert not budget.fits(0.41, start=0.1, rule=SlackRule.BANKED)
    assert not budget.fits(0.4, start=0.1, rule=SlackRule.ITERATION)


@pytest.mark.parametrize("name", ["tropical", "tropical+"])
@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(500, 6000), st.integers(2, 80)), min_size=20, max_size=60))
def test_chunked_multiplexing_keeps_tpot_of_every_request_it_touches_with_exact_predictor(name, lengths):
    """``tropical`` with chunked multiplexing alone, and ``tropical+`` (laxity order too)."""
    policy = make_policy(name, PolicyParams(toggle=ToggleParams(chunked=True)))
    sim = Watched(CLUSTER.build(policy), policy, bursty(lengths, gap=0.005))
    done = sim.run()
    multiplexed = [r for r in done if r.path is PrefillPath.MULTIPLEX]
    assert multiplexed and sim.mixed, "the workload must take Path 2"
    for req in multiplexed:                        # prefilled in chunks, then decoded in place
        assert tpot(req) <= req.slo.tpot * (1 + 1e-9)
        assert req.max_gap <= req.slo.tpot * (1 + 1e-9)
    for start, end, decoding in sim.mixed:         # and nobody decoding beside the chunks waits
        assert all(end - start <= req.slo.tpot * (1 + 1e-9) for req, _ in decoding)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(500, 6000), st.integers(2, 12)), min_size=20, max_size=60))
def test_chunked_multiplexing_keeps_the_final_tpot_of_requests_that_migrated_beside_it(lengths):
    """A request prefilled on a prefill worker first waits for the multiplexing worker's
    iteration in flight: iterations at its TPOT SLO from then on would leave its mean above the
    SLO (short outputs show it most), so each mixed iteration also ends by every decode's
    tokens x SLO. Every request that decoded beside a chunk, migrated ones included, ends
    within its TPOT SLO."""
    policy = make_policy("tropical+")
    sim = Watched(CLUSTER.build(policy), policy, bursty(lengths, gap=0.005))
    done = sim.run()
    beside = {req.id for _, _, decoding in sim.mixed for req, _ in decoding}
    migrated = [r for r in done if r.id in beside and r.path is not PrefillPath.MULTIPLEX]
    assume(migrated)
    assert all(tpot(r) <= r.slo.tpot * (1 + 1e-9) for r in done if r.id in beside)
    assert all(steps == 1 for steps in sim.held), "a held prompt is looked at again next iteration"


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5000), st.floats(0, 1e-3), st.floats(0, 1e-7), st.floats(0, 2.0),
       st.integers(0, 6000))
def test_largest_chunk_is_the_last_chunk_within_the_limit(most, linear, quadratic, limit, near):
    def time_of(n):
        return 0.01 + linear * n + quadratic * n * n
    chunk = largest_chunk(most, time_of, limit, near)
    assert chunk == max((n for n in range(1, most + 1) if time_of(n) <= limit), default=0)


def test_largest_chunk_from_a_good_guess_prices_two_chunks():
    """Consecutive chunks of a prompt differ by a few tokens: starting from the last one, the
    search needs only that chunk and its neighbour when the guess is right."""
    priced = []

    def time_of(n):
        priced.append(n)
        return 0.01 + 1e-4 * n + 1e-8 * n * n

    answer = largest_chunk(4096, time_of, 0.05)
    priced.clear()
    assert largest_chunk(4096, time_of, 0.05, near=answer) == answer
    assert sorted(priced) == [answer, answer + 1]
    priced.clear()
    assert largest_chunk(4096, time_of, 0.05, near=answer + 7) == answer
    assert len(priced) <= 4


def test_chunked_multiplexing_prices_a_long_prompt_by_its_attention_work():
    """Chunks shrink as a long prompt's cached context grows: the predicted first token must
    count that work (a token count would promise a fraction of the real time)."""
    model = linear_model(prefill_per_pair=2e-8)
    cluster = ClusterSpec("t", (WorkerSpec(REPLICA, model, 200_000),) * 2)
    first = make_request(0, arrival=0.0, prompt=20_000, output=2, ttft=60.0, tpot=0.1)
    second = make_request(1, arrival=0.01, prompt=16_000, output=2, ttft=9.0, tpot=0.1)
    policy = make_policy("tropical+", PolicyParams(toggle=ToggleParams(num_prefill=1)))
    Simulator(cluster.build(policy), policy, [first, second]).run()
    assert second.path is PrefillPath.MULTIPLEX
    predicted = float(second.reason.rsplit("predicted ", 1)[1].rstrip("s"))
    actual = second.first_token - second.arrival
    assert 0.85 * predicted <= actual <= predicted


@pytest.mark.parametrize(("least_loaded", "chosen"), [(False, 1), (True, 0)])
def test_path1_takes_the_earliest_predicted_finish_or_else_the_baselines_dispatch(least_loaded, chosen):
    """Attention makes one 30k-token prompt cost more than three of 11k: the fewest unfinished
    tokens and the earliest predicted finish name different prefill workers."""
    policy = make_policy("tropical", PolicyParams(toggle=ToggleParams(least_loaded=least_loaded)))
    workers = [make_worker(Role.PREFILL, policy.rules(Role.PREFILL), wid=i) for i in range(2)]
    workers[0].enqueue(make_request(0, prompt=30_000, ttft=1000.0))
    for i in range(3):
        workers[1].enqueue(make_request(1 + i, prompt=11_000, ttft=1000.0))
    [assignment] = policy.on_arrival(make_request(9, prompt=100, ttft=1000.0), 0.0, workers)
    assert assignment.path is PrefillPath.PREFILL_WORKER
    assert assignment.worker_id == chosen


@pytest.mark.parametrize("bias", [-0.2, 0.2])
def test_the_toggle_learns_a_biased_profile_from_its_own_iterations(bias):
    """Every prediction off by ``bias``: with online correction each worker that ran work ends
    up predicting the iterations as they really took."""
    policy = make_policy("tropical+", PolicyParams(toggle=ToggleParams(correct=True)))
    workers = CLUSTER.build(policy, predictor_bias=bias)
    Simulator(workers, policy, bursty([(2000, 200)] * 120, gap=0.01), truth=CLUSTER.truth).run()
    ran = {Role.PREFILL: BatchShape.prefill(2000), Role.MULTIPLEX: BatchShape.decode(4, 8000)}
    for worker in workers:
        shape = ran[worker.role]
        assert worker.latency.iteration_time(shape) == pytest.approx(
            CLUSTER.reference.iteration_time(shape), rel=0.01)


def test_tropical_plus_with_demotion_serves_the_prompts_it_yields_last_and_only_doomed_ones():
    requests = bursty([(3000, 20)] * 40 + [(200, 20)] * 40, gap=0.005)
    sim, result = simulate("tropical+", requests, chunked=True, laxity=True, least_loaded=True,
                           demote_doomed=True)
    yielded = [r for r in requests if r.yielded]
    assert yielded, "the burst should leave some prompts out of reach"
    assert all(r.finish is not None for r in requests)                  # yielded, never dropped
    assert all(r.first_token - r.arrival > r.slo.ttft for r in yielded)   # only doomed ones yield


def _rounds(name: str, requests) -> list[list[tuple[int, bool]]]:
    """Each iteration end's round: the prompts it tried to move, in order, and whether it
    moved each."""
    policy = make_policy(name)
    rounds: list[list[int]] = []
    moves: list[set[int]] = []
    end, choose = policy.on_iteration_end, policy._best_option

    def on_iteration_end(worker, now, workers):
        rounds.append([])
        assignments = end(worker, now, workers)
        moves.append({a.request.id for a in assignments if a.path is PrefillPath.MULTIPLEX})
        return assignments

    def best_option(req, workers, plans, now, worth_by):
        if len(rounds) > len(moves):                   # in a round, not an arrival
            rounds[-1].append(req.id)
        return choose(req, workers, plans, now, worth_by)

    policy.on_iteration_end, policy._best_option = on_iteration_end, best_option
    Simulator(CLUSTER.build(policy), policy, requests).run()
    return [[(rid, rid in moved) for rid in tried]
            for tried, moved in zip(rounds, moves, strict=True) if tried]


def test_a_demoting_round_ends_at_the_first_prompt_path2_cannot_save():
    """Under overload, many at-risk prompts would finish past their SLO on every multiplexing
    worker: ``tropical+`` (chunked multiplexing with demotion) stops its round at the first
    (weighing on, this flood weighs others after one in many rounds)."""
    flood = bursty([(1500 + 300 * (i % 5), 20) for i in range(120)], gap=0.004)
    plus = _rounds("tropical+", flood)
    assert any(not ok for r in plus for _, ok in r), "the flood has prompts Path 2 cannot save"
    assert all(ok for r in plus for _, ok in r[:-1])


def _every_option(policy, req, workers, plans, now, worth_by):
    """``_best_option`` as it was: every worker priced in full, checks and all."""
    options = [(done, w.id, w) for w in workers
               if (done := policy._multiplex_finish(req, w, plans.get(w.id), now)) is not None]
    return min(options) if options else None


@pytest.mark.parametrize(("workers", "demote", "scale"),
                         [(None, True, 1.0), (None, False, 1.0), (32, True, 8.0)])
def test_tropical_plus_decides_alike_pricing_in_full_only_the_worker_it_takes(monkeypatch, workers, demote,
                                                                             scale):
    """``_best_option`` checks workers in the order of their finish priced before the checks,
    and stops at the first that takes the prompt (or whose finish is not worth taking): the
    arrivals and the rounds then decide exactly as when they price every worker of the
    shortlist in full (a slice of the conversation trace past capacity on the paper's cluster,
    where dozens of prompts are multiplexed, and on 32 workers at 8x its rate, whose
    shortlists are longer)."""
    def outcomes() -> list[tuple]:
        cfg = replace(SimConfig(limit=300).with_preset(), demote_doomed=demote)
        cfg = cfg if workers is None else replace(cfg, workers=workers)
        result = simulate_experiment(experiment(cfg).with_policy("tropical+").at_rate(scale))
        return [(r.id, r.path, r.prefill_worker, r.decode_worker, r.first_token, r.finish)
                for r in result.requests]

    chosen = outcomes()
    monkeypatch.setattr(TropicalPolicy, "_best_option", _every_option)
    assert outcomes() == chosen
    assert sum(path is PrefillPath.MULTIPLEX for _, path, *_ in chosen) > 20
