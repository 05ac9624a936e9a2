import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import make_request, make_worker, migrate_in, start_decoding
from tropical.sched.rules import Role
from tropical.sched.worker import CHUNK_SHARE_KEEP


def test_lazy_decode_tracks_each_request_exactly():
    worker = make_worker()
    short, long = make_request(0, output=3), make_request(1, output=6)
    for req in (short, long):
        start_decoding(worker, req)
    assert worker.batch_size == 2 and worker.decode_context == 2 * 101
    assert worker.steps_to_next_finish() == 2
    assert worker.advance_decodes(2, now=1.0) == [short]
    assert short.finish == 1.0 and short.generated == 3
    assert worker.generated(long) == 3
    assert worker.decode_context == 100 + 3
    assert worker.running_remaining == 3


def test_a_run_may_not_skip_past_a_finish():
    worker = make_worker()
    req = make_request(output=3)
    start_decoding(worker, req)
    with pytest.raises(AssertionError):
        worker.advance_decodes(3, now=1.0)


def test_finishing_frees_kv_and_load():
    worker = make_worker()
    req = make_request(output=2)
    worker.enqueue(req)
    assert worker.unfinished_tokens == 100 + 1
    worker.reserve(req)
    used = worker.kv.used_blocks
    assert used == worker.kv.blocks_for(req.kv_tokens)
    worker.complete_prefill(req, 100, now=0.0)
    worker.advance_decodes(1, now=0.1)
    assert worker.kv.used_blocks == 0 and worker.unfinished_tokens == 0


def test_prefill_worker_holds_only_the_prompt_and_keeps_request_for_migration():
    worker = make_worker(Role.PREFILL)
    req = make_request(output=5)
    worker.enqueue(req)
    worker.reserve(req)
    assert worker.kv.used_blocks == worker.kv.blocks_for(100)
    assert worker.complete_prefill(req, 100, now=0.5)
    assert req.first_token == 0.5 and req.generated == 1 and not worker.running


def test_abort_mid_decode_frees_everything():
    worker = make_worker()
    req = make_request(output=10)
    start_decoding(worker, req)
    worker.advance_decodes(4, now=1.0)
    worker.abort(req)
    assert worker.kv.used_blocks == 0 and worker.decode_context == 0
    assert worker.running_remaining == 0 and req.generated == 5


def test_reserve_that_does_not_fit_changes_nothing():
    worker = make_worker(kv_tokens=160)
    req = make_request(prompt=150, output=20)
    assert not worker.reserve(req)
    assert worker.kv.used_blocks == 0 and not worker.holds


def test_migrated_request_joins_only_when_admitted():
    worker = make_worker(Role.DECODE)
    req = make_request(output=5)
    req.generated = 1
    worker.expect_migration(req)
    assert worker.incoming_tokens == 4
    worker.arrive_migrated(req)
    assert worker.batch_size == 0 and worker.incoming_tokens == 4
    worker.admit_inbox()
    assert worker.batch_size == 1 and worker.incoming_tokens == 0


def test_queued_work_tracks_prefills_not_yet_running():
    from tropical.sched.batching import form_batch
    from tropical.sched.rules import BatchRules

    worker = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, token_budget=150))
    reqs = [make_request(i, prompt=100) for i in range(3)]
    for req in reqs:
        worker.enqueue(req)
    one = worker.prefill_cost(reqs[0])
    assert worker.queued_work == pytest.approx(3 * one)
    batch = form_batch(worker)
    assert len(batch.prefills) == 1 and worker.queued() == reqs[1:]
    assert worker.queued_work == pytest.approx(2 * one)
    worker.abort(reqs[2])
    assert worker.queued_work == pytest.approx(one)
    worker.complete_prefill(reqs[0], 100, now=1.0)
    assert worker.queued() == [reqs[1]]


def test_abort_of_a_request_migrating_in_clears_incoming_and_inbox():
    worker = make_worker(Role.DECODE)
    on_the_way, landed = make_request(0, output=5), make_request(1, output=5)
    for req in (on_the_way, landed):
        req.generated = 1
        worker.expect_migration(req)
    worker.arrive_migrated(landed)
    for req in (on_the_way, landed):
        worker.abort(req)
    assert not worker.incoming and not worker.inbox and worker.kv.used_blocks == 0
    assert worker.unfinished_tokens == 0
    worker.admit_inbox()
    assert not worker.running


def test_gaps_include_the_wait_since_the_last_token_and_a_runs_iterations():
    worker = make_worker()
    a = start_decoding(worker, make_request(0, output=5), now=0.0)
    worker.advance_decodes(1, now=0.1)
    b = start_decoding(worker, make_request(1, output=10), now=0.15)
    done = worker.advance_decodes(3, now=1.0, first=0.2, growth=0.1)  # 0.2, 0.3, 0.4 s
    assert done == [a]
    assert a.max_gap == pytest.approx(0.4)
    assert b.max_gap == pytest.approx(0.15)      # the run's gaps fold in when b finishes
    gaps = worker.gaps.histogram
    assert gaps.count == 7              # a: 0.1, 0.2, 0.3, 0.4; b: 0.15, 0.3, 0.4
    assert gaps.mean == pytest.approx((0.1 + 0.2 + 0.15 + 2 * 0.3 + 2 * 0.4) / 7)


def test_a_prefill_only_iteration_between_decode_steps_is_a_stall():
    worker = make_worker()
    req = start_decoding(worker, make_request(0, output=4), now=0.0)
    worker.advance_decodes(1, now=0.05)
    worker.advance_decodes(1, now=1.6)               # a long prefill ran in between
    worker.advance_decodes(1, now=1.65)
    assert req.max_gap == pytest.approx(1.55)


def test_a_migrated_request_first_gap_counts_from_its_first_token():
    worker = make_worker(role=Role.MULTIPLEX)
    req = make_request(0, output=2)
    req.first_token, req.generated = 1.0, 1
    worker.expect_migration(req)
    worker.arrive_migrated(req)
    worker.admit_inbox()
    worker.advance_decodes(1, now=1.3)
    assert req.max_gap == pytest.approx(0.3)


def test_laxity_queues_least_ttft_slack_first_but_never_ahead_of_the_running_batch():
    from tropical.sched.rules import BatchRules

    worker = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, laxity=True))
    relaxed = make_request(0, arrival=0.0, ttft=5.0)
    urgent = make_request(1, arrival=0.1, ttft=0.5)
    middle = make_request(2, arrival=0.2, ttft=2.0)
    worker.enqueue(relaxed)
    worker.start_prefills([(relaxed, relaxed.prompt_len)])                    # already running: stays first
    for req in (urgent, middle):
        worker.enqueue(req)
    worker.enqueue(make_request(3, arrival=0.3, ttft=1.0))
    assert [r.id for r in worker.waiting] == [0, 1, 3, 2]


@pytest.mark.parametrize(("weight", "short_ttft", "long_ttft", "order"), [
    (-1.0, 5.0, 5.5, [1, 0]),       # the long prompt must start first: latest start first
    (0.0, 5.0, 5.5, [0, 1]),        # the short one is due first: deadline first
    (0.0, 5.5, 5.0, [1, 0]),
    (2.0, 5.5, 5.0, [0, 1]),        # due later, but the long one's own time outweighs it
])
def test_the_size_weight_sets_how_a_prompt_s_own_time_moves_it_back(weight, short_ttft, long_ttft, order):
    from tropical.sched.rules import BatchRules

    worker = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, laxity=True, size_weight=weight))
    short, long = make_request(0, prompt=100, ttft=short_ttft), make_request(1, prompt=8_000, ttft=long_ttft)
    assert worker.prefill_cost(long) > 0.5 + worker.prefill_cost(short)
    for req in (short, long):
        worker.enqueue(req)
    assert [r.id for r in worker.waiting] == order
    for req in (short, long):
        cost = worker.prefill_cost(req)
        assert worker.queue_key(req) == pytest.approx(req.arrival + req.slo.ttft + weight * cost)


@pytest.mark.parametrize("weight", [-1.0, 0.0, 2.0])
def test_work_ahead_follows_the_queue_key_a_new_prompt_is_placed_by(weight):
    from tropical.sched.rules import BatchRules

    worker = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, laxity=True, size_weight=weight))
    for i, (prompt, ttft) in enumerate(((2_000, 3.0), (100, 2.0), (4_000, 6.0), (500, 4.0))):
        worker.enqueue(make_request(i, prompt=prompt, ttft=ttft))
    for j, (prompt, ttft) in enumerate(((300, 2.5), (6_000, 5.0), (50, 9.0))):
        new = make_request(10 + j, prompt=prompt, ttft=ttft)
        ahead = worker.work_ahead(worker.key_of(new, worker.prefill_cost(new)), 64)
        worker.enqueue(new)
        place = list(worker.waiting).index(new)
        assert ahead == pytest.approx(sum(worker.prefill_cost(r) for r in list(worker.waiting)[:place]))
        worker.abort(new)


def test_queued_costs_follow_every_change_of_the_queue():
    from tropical.sched.batching import form_batch
    from tropical.sched.rules import BatchRules

    worker = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, token_budget=150))
    reqs = [make_request(i, prompt=100 * (i + 1)) for i in range(4)]

    def priced() -> list[tuple[int, float]]:
        return [(req.id, cost) for req, cost in worker.queued_costs(2)]

    for req in reqs[:3]:
        worker.enqueue(req)
    assert priced() == [(r.id, worker.prefill_cost(r)) for r in reqs[:2]]
    form_batch(worker)                                          # reqs[0] starts: no longer queued
    assert [rid for rid, _ in priced()] == [1, 2]
    worker.abort(reqs[1])
    assert [rid for rid, _ in priced()] == [2]
    worker.enqueue(reqs[3])
    assert [rid for rid, _ in priced()] == [2, 3]



def test_queued_costs_stand_through_edits_that_leave_the_priced_prompts_as_they_were():
    from tropical.sched.batching import form_batch
    from tropical.sched.rules import BatchRules

    worker = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, token_budget=150))
    reqs = [make_request(i, prompt=100) for i in range(5)]
    for req in reqs[:4]:
        worker.enqueue(req)
    form_batch(worker)                                          # reqs[0] runs; 1, 2 priced
    priced = worker.queued_costs(2)
    worker.enqueue(reqs[4])                                     # joins behind them
    assert worker.queued_costs(2) is priced
    worker.complete_prefill(reqs[0], 100, now=1.0)              # the batch in flight leaves
    assert worker.queued_costs(2) is priced
    worker.abort(reqs[3])                                       # leaves from behind them
    assert worker.queued_costs(2) is priced
    assert [r.id for r, _ in priced] == [1, 2]
    worker.enqueue(make_request(9, prompt=100))                 # the priced list was not full
    assert [r.id for r, _ in worker.queued_costs(3)] == [1, 2, 4]


def test_queued_costs_reprice_a_prompt_once_a_chunk_of_it_ran():
    from tropical.sched.batching import form_batch
    from tropical.sched.rules import BatchRules

    worker = make_worker(Role.COLOCATED, rules=BatchRules(chunked=True, token_budget=150))
    req = make_request(0, prompt=300)
    worker.enqueue(req)
    form_batch(worker)
    assert worker.queued_costs(4) == ()                         # its first chunk runs
    worker.complete_prefill(req, 150, now=1.0)
    assert worker.queued_costs(4) == ((req, worker.prefill_cost(req)),)
    assert worker.prefill_cost(req) < worker.prefill_cost(make_request(1, prompt=300))


def test_peak_context_sums_the_running_requests_at_their_longest():
    worker = make_worker()
    short, long, cut = make_request(0, output=3), make_request(1, output=6), make_request(2, output=9)
    for req in (short, long, cut):
        start_decoding(worker, req)
    assert worker.decode_peak == short.kv_tokens + long.kv_tokens + cut.kv_tokens
    worker.advance_decodes(2, now=1.0)
    worker.abort(cut)
    assert worker.decode_peak == long.kv_tokens


def test_min_tpot_follows_the_running_batch_through_joins_finishes_and_aborts():
    worker = make_worker()
    assert worker.min_tpot() == float("inf")
    loose, tight, middle = (make_request(i, output=out, tpot=tpot)
                            for i, out, tpot in ((0, 10, 0.2), (1, 3, 0.05), (2, 10, 0.1)))
    start_decoding(worker, loose)
    assert worker.min_tpot() == 0.2
    start_decoding(worker, tight)
    start_decoding(worker, middle)
    assert worker.min_tpot() == 0.05
    worker.advance_decodes(2, now=1.0)             # the tight one finishes
    assert worker.min_tpot() == 0.1
    worker.abort(middle)
    assert worker.min_tpot() == 0.2


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["join", "abort", "advance"]), st.integers(0, 30),
                          st.sampled_from([0.05, 0.1, 0.2]), st.booleans()), max_size=40))
def test_min_tpot_kept_through_the_batch_changes_is_the_batch_minimum(steps):
    worker = make_worker()
    for n, (op, pick, tpot, ask) in enumerate(steps):
        running = list(worker.running.values())
        if op == "join":
            start_decoding(worker, make_request(100 + n, output=2 + pick % 5, tpot=tpot))
        elif op == "abort" and running:
            worker.abort(running[pick % len(running)])
        elif op == "advance" and running:
            worker.advance_decodes(1, now=float(n))
        if ask:                                    # asked now and then, as the toggle asks
            assert worker.min_tpot() == min((r.slo.tpot for r in worker.running.values()),
                                            default=float("inf"))


def test_a_prompt_that_yielded_waits_behind_every_prompt_that_can_still_make_it():
    from tropical.core.request import PrefillPath
    from tropical.sched.policy import Assignment, apply
    from tropical.sched.rules import BatchRules

    worker = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, laxity=True))
    hopeless = [make_request(i, arrival=0.0, ttft=0.01) for i in range(2)]
    for req in hopeless:
        apply(Assignment(req, 0, PrefillPath.FALLBACK, "out of reach", yields=True), [worker])
    later = make_request(2, arrival=1.0, ttft=5.0)
    worker.enqueue(later)
    urgent = make_request(3, arrival=1.0, ttft=0.5)
    worker.enqueue(urgent)
    assert [r.id for r in worker.waiting] == [3, 2, 0, 1]      # by slack, then the yielded in order
    assert all(r.yielded for r in hopeless) and not later.yielded
    apply(Assignment(hopeless[0], 0, PrefillPath.FALLBACK, "moved", from_worker=0), [worker])
    assert hopeless[0].yielded                                # once out of reach, always


def test_under_laxity_the_priced_prompts_end_at_the_first_that_yielded():
    from tropical.core.request import PrefillPath
    from tropical.sched.policy import Assignment, apply
    from tropical.sched.rules import BatchRules

    worker = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, laxity=True))
    hopeless = make_request(0, arrival=0.0, ttft=0.01)
    apply(Assignment(hopeless, 0, PrefillPath.FALLBACK, "out of reach", yields=True), [worker])
    hopeful = make_request(1, arrival=1.0, ttft=5.0)
    worker.enqueue(hopeful)
    priced = worker.queued_costs(4)
    assert [r.id for r, _ in priced] == [1]                   # the yielded one is behind it, unpriced
    gone = make_request(2, arrival=0.0, ttft=0.01)
    apply(Assignment(gone, 0, PrefillPath.FALLBACK, "out of reach", yields=True), [worker])
    assert worker.queued_costs(4) is priced                   # joined behind the first that yielded
    worker.enqueue(make_request(3, arrival=1.0, ttft=9.0))
    assert [r.id for r, _ in worker.queued_costs(4)] == [1, 3]


def test_in_arrival_order_prompts_that_yielded_are_priced_for_those_behind_them():
    from tropical.core.request import PrefillPath
    from tropical.sched.policy import Assignment, apply
    from tropical.sched.rules import BatchRules

    worker = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True))
    hopeless = make_request(0, arrival=0.0, ttft=0.01)
    apply(Assignment(hopeless, 0, PrefillPath.FALLBACK, "out of reach", yields=True), [worker])
    worker.enqueue(make_request(1, arrival=1.0, ttft=5.0))
    assert [r.id for r, _ in worker.queued_costs(4)] == [0, 1]


def test_a_migrated_request_is_watched_until_it_is_on_pace_with_its_tpot_slo():
    """First token at 0, TPOT SLO 0.1 s: its second token is due at 0.1 s. Joining at 0.06 s it
    is within one SLO of its pace; once a token comes early enough it has a whole SLO to spare
    and sets no deadline."""
    worker = make_worker(Role.MULTIPLEX)
    req = make_request(7, output=50, tpot=0.1)
    migrate_in(worker, req)
    assert worker.catch_up_deadline(0.06) == pytest.approx(0.1)
    worker.advance_decodes(1, now=0.09)
    assert worker.catch_up_deadline(0.09) == math.inf


def test_a_decode_whose_iterations_ran_long_is_watched_until_it_is_back_on_pace():
    """Its iterations took 0.12 s against a 0.1 s TPOT SLO (as when a predictor errs by 20%): after
    five of them (six tokens by 0.6 s) its seventh token is due at 0.6 s, so the next iteration
    must end at once; a 0.02 s one leaves it within one SLO of its pace (its eighth due at 0.7
    s), and a second puts it a whole SLO ahead, when it sets no deadline."""
    worker = make_worker(Role.MULTIPLEX)
    req = make_request(7, output=50, tpot=0.1)
    start_decoding(worker, req)
    assert worker.catch_up_deadline(0.0) == math.inf
    for step in range(1, 6):
        worker.advance_decodes(1, now=0.12 * step)
    assert worker.catch_up_deadline(0.6) == pytest.approx(0.6)
    worker.advance_decodes(1, now=0.62)
    assert worker.catch_up_deadline(0.62) == pytest.approx(0.7)
    worker.advance_decodes(1, now=0.64)
    assert worker.catch_up_deadline(0.64) == math.inf


def _scanned_slot(worker, req) -> int:
    """Where laxity order puts ``req``, read from the back one prompt at a time."""
    key, slot = worker.queue_key(req), len(worker.waiting)
    for queued in reversed(worker.waiting):
        if slot <= worker.batch_prefills or worker.queue_key(queued) <= key:
            break
        slot -= 1
    return slot


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["queue", "yield", "abort", "start", "finish"]),
                          st.integers(0, 50), st.floats(0.05, 20.0)), max_size=60))
def test_the_count_of_prompts_that_yielded_at_the_back_never_overcounts(steps):
    from tropical.core.request import PrefillPath
    from tropical.sched.policy import Assignment, apply
    from tropical.sched.rules import BatchRules

    worker = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, laxity=True))
    for n, (op, pick, ttft) in enumerate(steps):
        queued = list(worker.waiting)
        if op == "queue":
            req = make_request(1000 + n, arrival=0.01 * n, ttft=ttft)
            assert worker._laxity_slot(req) == _scanned_slot(worker, req)
            worker.enqueue(req)
        elif op == "yield" and queued:
            req = queued[pick % len(queued)]
            apply(Assignment(req, 0, PrefillPath.FALLBACK, "out of reach", 0, yields=True), [worker])
        elif op == "abort" and queued:
            worker.abort(queued[pick % len(queued)])
        elif op == "start" and len(queued) > worker.batch_prefills:
            head = queued[worker.batch_prefills]
            worker.start_prefills([*((r, r.remaining_prompt) for r in queued[:worker.batch_prefills]),
                                   (head, head.remaining_prompt)])
        elif op == "finish" and worker.batch_prefills:
            done = queued[pick % worker.batch_prefills]
            worker.reserve(done)
            worker.complete_prefill(done, done.remaining_prompt, now=1.0)
        tail = worker._yielded_tail
        assert 0 <= tail <= len(worker.waiting)
        assert all(r.yielded for r in list(worker.waiting)[len(worker.waiting) - tail:])


def test_work_ahead_sums_the_prompts_with_less_slack_as_laxity_order_places_a_new_one():
    from tropical.sched.batching import form_batch
    from tropical.sched.rules import BatchRules

    worker = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, laxity=True, token_budget=100))
    reqs = [make_request(i, prompt=100, ttft=ttft) for i, ttft in enumerate((0.5, 1.0, 2.0, 4.0))]
    for req in reqs:
        worker.enqueue(req)
    form_batch(worker)                                          # reqs[0] runs: not waited for
    cost = worker.prefill_cost(reqs[1])
    for key, waited in ((0.0, 0), (0.99, 1), (1.0 - cost, 1), (3.0, 2), (10.0, 3)):
        new = make_request(9, prompt=100, ttft=key + cost)      # its latest start here is key
        expected = sum(worker.prefill_cost(r) for r in reqs[1:1 + waited])
        assert worker.work_ahead(key, 64) == pytest.approx(expected)
        if waited < 3:
            worker.enqueue(new)
            assert list(worker.waiting).index(new) == 1 + waited    # where laxity order put it
            worker.abort(new)
    assert worker.work_ahead(10.0, 2) == worker.queued_work    # past the prompts read: all of them


def test_work_ahead_is_the_whole_queue_under_arrival_order_and_follows_its_changes():
    from tropical.sched.rules import BatchRules

    fifo = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True))
    lax = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, laxity=True), wid=1)
    for worker in (fifo, lax):
        for i in range(3):
            worker.enqueue(make_request(i, prompt=100 * (i + 1), ttft=1.0 + i))
    assert fifo.work_ahead(-1.0, 64) == fifo.queued_work
    before = lax.work_ahead(10.0, 64)
    assert before == pytest.approx(lax.queued_work)
    lax.abort(lax.waiting[1])
    assert lax.work_ahead(10.0, 64) == pytest.approx(lax.queued_work)
    assert lax.queued_work < before


def test_chunk_share_follows_the_decode_iterations_that_carried_a_prompt():
    worker = make_worker()
    start_decoding(worker, make_request(1, prompt=100, output=10_000))
    prompt = make_request(2, prompt=1000)
    worker.enqueue(prompt)
    worker.start_prefills([(prompt, 500)])
    worker.advance_decodes(1, 1.0)
    assert worker.chunk_share == pytest.approx(1 - CHUNK_SHARE_KEEP)
    worker.start_prefills([])
    worker.advance_decodes(3, 2.0, first=0.1)
    assert worker.chunk_share == pytest.approx((1 - CHUNK_SHARE_KEEP) * CHUNK_SHARE_KEEP ** 3)
    for step in range(2000):
        worker.start_prefills([(prompt, 1)])
        worker.advance_decodes(1, 3.0 + step)
    assert worker.chunk_share == pytest.approx(1.0, abs=1e-6)
