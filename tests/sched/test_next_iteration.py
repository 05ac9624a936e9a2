"""The toggle's view of a multiplexing worker's next iteration while a prompt is chunked."""

import math
from dataclasses import replace

from tests.factories import make_request, make_worker, start_decoding
from tropical.sched.batching import form_batch
from tropical.sched.next_iteration import NextIteration
from tropical.sched.rules import BatchRules, Role
from tropical.sched.slack import Decoding, SlackRule, TpotBudget

CHUNKED = BatchRules(prefill_first=False, chunked=True, token_budget=512)


def busy_worker(prompt: int):
    """A multiplexing worker decoding one request, with a chunk of ``prompt`` in flight."""
    worker = make_worker(Role.MULTIPLEX, CHUNKED)
    start_decoding(worker, make_request(0, prompt=100, output=50))
    long = make_request(1, prompt=prompt, output=5)
    worker.enqueue(long)
    batch = form_batch(worker, now=0.0)
    worker.busy_until = 0.1
    return worker, long, batch


def test_a_chunk_in_flight_leaves_the_rest_of_its_prompt_ahead_of_the_queue():
    worker, long, batch = busy_worker(prompt=2000)
    chunk = batch.prefills[0][1]
    nxt = NextIteration.of(worker, now=0.05)
    assert chunk < 2000
    assert nxt.carried == ((long, 2000 - chunk),)
    assert long not in [d.request for d in nxt.decodes]      # it does not decode next
    assert nxt.queued == ()


def test_a_prompt_finishing_in_flight_decodes_in_the_next_iteration():
    worker, short, _ = busy_worker(prompt=300)
    nxt = NextIteration.of(worker, now=0.05)
    assert nxt.carried == ()
    assert short in [d.request for d in nxt.decodes]


def test_an_idle_worker_carries_nothing():
    worker, long, batch = busy_worker(prompt=2000)
    worker.complete_prefill(long, batch.prefills[0][1], now=0.1)
    nxt = NextIteration.of(worker, now=0.2)
    assert nxt.carried == () and nxt.queued == (long,)


def test_the_sums_match_the_decodes_one_by_one():
    """Context, peak and TPOT budget come from the worker's sums and one pass over its batch;
    they equal what the decodes, listed one by one, add up to."""
    worker, short, _ = busy_worker(prompt=300)
    worker.advance_decodes(3, now=0.04)
    migrated = make_request(2, prompt=700, output=20, tpot=0.05)
    migrated.first_token, migrated.generated = 0.01, 1
    worker.expect_migration(migrated)
    for now in (0.05, 0.2):
        nxt = NextIteration.of(worker, now)
        decodes = nxt.decodes
        assert nxt.decode_count == len(decodes) == 3 - (now > worker.busy_until)
        assert nxt.decode_context == sum(d.request.prompt_len + d.generated for d in decodes)
        assert nxt.peak_context == sum(d.request.kv_tokens for d in decodes)
        assert nxt.budget == TpotBudget.of(decodes)
        assert nxt.min_tpot == min(d.request.slo.tpot for d in decodes) == nxt.budget.min_tpot


def test_a_copy_with_another_request_joining_prices_its_own_budget():
    """The tightest TPOT SLO and the budget are kept once asked for; a copy with one more
    request joining (how the toggle tries a decode destination) must not inherit them."""
    worker, _, _ = busy_worker(prompt=300)
    nxt = NextIteration.of(worker, 0.05)
    loose = nxt.min_tpot, nxt.budget
    tight = make_request(2, prompt=10, output=5, tpot=0.01)
    tight.first_token, tight.generated = 0.0, 1
    joined = replace(nxt, joining=(*nxt.joining, Decoding(tight, 1, 0.0)))
    assert joined.min_tpot == joined.budget.min_tpot == 0.01 < loose[0]
    assert (nxt.min_tpot, nxt.budget) == loose


def test_fits_reads_the_tightest_slo_per_iteration_and_the_deadline_when_banked():
    worker, _, _ = busy_worker(prompt=300)
    nxt = NextIteration.of(worker, 0.05)
    for rule in SlackRule:
        limit = nxt.budget.limit(nxt.start, rule)
        assert nxt.fits(limit, rule) and not nxt.fits(math.nextafter(limit, math.inf), rule)
