"""Prefill workers that cut long prompts into pieces and queue the rest again by its key
(``BatchRules.piece_tokens``): preemption at piece boundaries, KV kept safe, predictions that
count the rest."""

import pytest

from tests.factories import make_request, make_worker
from tropical.sched.batching import form_batch
from tropical.sched.rejection import work_ahead as admission_work_ahead
from tropical.sched.rules import BatchRules, Role


def _pieced(piece: int = 1_000, kv_tokens: int | None = None, **rules: object):
    extra = {} if kv_tokens is None else {"kv_tokens": kv_tokens}
    return make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, laxity=True, size_weight=2.0,
                                                      token_budget=256, piece_tokens=piece, **rules), **extra)


def _run(worker, now: float) -> list[tuple[int, int]]:
    """Form one batch and complete it; the spans it ran."""
    batch = form_batch(worker, now)
    for req, new, _ in batch.prefills:
        worker.complete_prefill(req, new, now)
    return [(req.id, new) for req, new, _ in batch.prefills]


def test_a_lone_long_prompt_runs_in_pieces_and_a_short_one_runs_whole():
    worker = _pieced()
    long = make_request(0, prompt=2_500, ttft=60.0)
    worker.enqueue(long)
    assert [_run(worker, t) for t in (0.0, 1.0, 2.0)] == [[(0, 1_000)], [(0, 1_000)], [(0, 500)]]
    assert long.first_token == 2.0 and long.computed == 2_500
    whole = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, token_budget=256))
    whole.enqueue(make_request(1, prompt=2_500))
    assert _run(whole, 0.0) == [(1, 2_500)]


def test_an_urgent_prompt_that_arrives_during_a_piece_runs_before_the_rest():
    worker = _pieced()
    long = make_request(0, prompt=3_000, ttft=60.0)
    worker.enqueue(long)
    assert _run(worker, 0.0) == [(0, 1_000)]
    urgent = make_request(1, arrival=0.5, prompt=100, ttft=0.5)
    worker.enqueue(urgent)                            # behind the piece in flight, as any arrival
    assert _run(worker, 1.0) == [(1, 100)]
    assert urgent.first_token == 1.0 and long.computed == 1_000
    assert _run(worker, 1.1) == [(0, 1_000)]


def test_without_laxity_the_rest_keeps_the_head():
    rules = BatchRules(prefill_first=True, token_budget=256, piece_tokens=1_000)
    worker = make_worker(Role.PREFILL, rules=rules)
    long = make_request(0, prompt=3_000, ttft=60.0)
    worker.enqueue(long)
    _run(worker, 0.0)
    worker.enqueue(make_request(1, arrival=0.5, prompt=100, ttft=0.5))
    assert _run(worker, 1.0) == [(0, 1_000)]


@pytest.mark.parametrize("during_the_piece", [True, False])
def test_a_rest_that_holds_kv_runs_before_a_head_whose_kv_cannot_fit_beside_it(during_the_piece):
    worker = _pieced(kv_tokens=4_096)
    long = make_request(0, prompt=3_000, ttft=60.0)
    big = make_request(1, arrival=0.5, prompt=2_000, ttft=0.5)    # urgent, but its KV does not fit
    worker.enqueue(long)
    batch = form_batch(worker, 0.0)
    if during_the_piece:
        worker.enqueue(big)
    worker.complete_prefill(long, batch.prefills[0][1], 1.0)
    if not during_the_piece:
        worker.enqueue(big)
    assert list(worker.waiting) == ([long, big] if during_the_piece else [big, long])    # kept / moved up
    assert _run(worker, 1.0) == [(0, 1_000)] and _run(worker, 2.0) == [(0, 1_000)]
    assert worker.kv.used_blocks <= worker.kv.capacity_blocks and big.id not in worker.holds
    worker.release(long)                                          # migrated: its KV freed
    assert _run(worker, 3.0) == [(1, 1_000)]


def test_the_queue_s_predicted_work_counts_the_rest_of_a_piece_in_flight():
    worker = _pieced()
    long = make_request(0, prompt=3_000, ttft=60.0)
    worker.enqueue(long)
    whole = worker.prefill_cost(long)
    form_batch(worker, 0.0)
    rest = worker.rest_cost(long, 2_000)
    assert worker.queued_work == pytest.approx(rest) and 0 < rest < whole
    late = make_request(1, arrival=0.1, prompt=4_000, ttft=600.0)      # keyed after the rest
    urgent = make_request(2, arrival=0.1, prompt=100, ttft=0.2)        # keyed before it
    assert worker.work_ahead(worker.key_of(late, worker.prefill_estimate(late)), 64) == pytest.approx(rest)
    assert worker.work_ahead(worker.key_of(urgent, worker.prefill_estimate(urgent)), 64) == 0.0
    worker.complete_prefill(long, 1_000, 1.0)
    assert worker.queued_work == pytest.approx(worker.prefill_cost(long)) == pytest.approx(rest)


def test_admission_counts_the_rest_of_a_piece_in_flight_for_prompts_keyed_after_it():
    worker = _pieced()
    long = make_request(0, prompt=3_000, ttft=60.0)
    worker.enqueue(long)
    form_batch(worker, 0.0)
    rest = worker.rest_cost(long, 2_000)
    late = make_request(1, arrival=0.1, prompt=4_000, ttft=600.0)
    urgent = make_request(2, arrival=0.1, prompt=100, ttft=0.2)
    for req, ahead in ((late, rest), (urgent, 0.0)):
        cost = worker.prefill_estimate(req)
        assert admission_work_ahead(worker, req, cost) == pytest.approx(ahead)


def test_aborting_a_prompt_mid_piece_takes_its_rest_out_of_the_predicted_work():
    worker = _pieced()
    long = make_request(0, prompt=3_000, ttft=60.0)
    worker.enqueue(long)
    form_batch(worker, 0.0)
    worker.abort(long)
    assert worker.queued_work == pytest.approx(0.0) and not worker.rests and not worker.waiting
    assert worker.kv.used_blocks == 0


@pytest.mark.parametrize("piece", [-1, -4096])
def test_a_negative_piece_is_named(piece):
    with pytest.raises(ValueError, match="piece_tokens must be 0"):
        BatchRules(piece_tokens=piece)


def test_a_prompt_that_yields_after_pieces_finds_its_own_kv_cached_but_it_counts_as_no_reuse():
    from tests.factories import linear_model
    from tropical.core.request import Request
    from tropical.core.slo import SLO
    from tropical.sched.kv import KVPool
    from tropical.sched.prefix_cache import PrefixCache
    from tropical.sched.worker import WorkerState

    rules = BatchRules(prefill_first=True, laxity=True, size_weight=2.0, token_budget=256, piece_tokens=1_024)
    worker = WorkerState(0, Role.PREFILL, rules, KVPool(1_000, 16, cache=PrefixCache(16)), linear_model())
    shared = Request(0, 0.0, 1_024, 10, SLO(60.0, 0.1), prefix=(1, 2), prefix_block=512)
    worker.enqueue(shared)
    _run(worker, 0.0)
    worker.release(shared)                                             # migrated: its blocks stay cached
    long = Request(1, 1.0, 3_000, 10, SLO(60.0, 0.1), prefix=(1, 2, 3, 4, 5, 6), prefix_block=512)
    worker.enqueue(long)
    found = long.cached
    assert found == long.reused == 1_024                              # the shared prefix: reuse
    assert _run(worker, 1.0) == [(1, 1_024)]
    worker.abort(long)                                                 # it yields: off the queue, back on
    long.yielded = True
    worker.enqueue(long)
    assert long.cached == found + 1_024                                # its own piece, found cached
    assert long.reused == found


@pytest.mark.parametrize(("cached", "reused"), [(0, 0), (512, 512), (2_048, 512), (8_192, 4_096)])
def test_reuse_is_the_cached_run_less_the_part_the_request_computed_itself(cached, reused):
    from tropical.core.request import Request
    from tropical.core.slo import SLO

    req = Request(0, 0.0, 9_000, 10, SLO(60.0, 0.1), own=(512, 4_608))
    req.cached = cached                  # as the hit a prompt takes when it starts may move it
    assert req.reused == reused
