"""``iteration_cap``: a multiplexing iteration that carries prompt chunks ends within the room the
tightest TTFT SLO seen leaves once that prompt's own iteration is paid (``TightestPrompt``), so
that the shortest prompts still find a worker that can start them in time under a loose TPOT
SLO."""

import math
from dataclasses import replace

import pytest

from tests.factories import make_request, make_worker, start_decoding
from tropical.config import SimConfig
from tropical.core.latency.iterations import prefill_time
from tropical.core.latency.shape import BatchShape
from tropical.core.metrics import miss_cause
from tropical.core.request import PrefillPath
from tropical.sched.batching import form_batch
from tropical.sched.rules import BatchRules, Role
from tropical.sched.slack import SlackRule
from tropical.sched.tightest import TightestPrompt
from tropical.sim.build import experiment
from tropical.sim.run import simulate

LATENCY = make_worker(Role.MULTIPLEX).latency
DECODE = BatchShape.decode(3, 3_000)


def test_the_tightest_is_the_least_ttft_slo_and_on_ties_the_longest_prompt():
    tight = TightestPrompt()
    assert tight.saw(make_request(1, prompt=100, ttft=1.0), LATENCY)
    assert not tight.saw(make_request(2, prompt=100, ttft=2.0), LATENCY)
    assert tight.saw(make_request(3, prompt=200, ttft=1.0), LATENCY)
    assert not tight.saw(make_request(4, prompt=50, ttft=1.0), LATENCY)
    assert (tight.ttft, tight.prompt_len) == (1.0, 200)


def test_a_slo_under_twice_the_prompts_own_prefill_is_not_taken_for_the_tightest():
    tight = TightestPrompt()
    assert not tight.saw(make_request(1, prompt=100, ttft=1.9 * prefill_time(LATENCY, 100)), LATENCY)
    assert not tight.saw(make_request(2, prompt=100, ttft=0.001), LATENCY)
    assert tight.ttft == math.inf
    assert tight.saw(make_request(3, prompt=100, ttft=2.1 * prefill_time(LATENCY, 100)), LATENCY)


def test_the_room_is_what_the_tightest_slo_leaves_after_its_own_iteration_where_that_binds():
    own = LATENCY.iteration_time(DECODE.plus_prefill(100, 0))
    tight = TightestPrompt(ttft=5 * own, prompt_len=100)
    assert tight.room(LATENCY, DECODE, 10.0) == pytest.approx(4 * own)
    assert tight.room(LATENCY, DECODE, 2 * own) == 2 * own           # the decodes' limit is tighter
    assert TightestPrompt(1.5 * own, 100).room(LATENCY, DECODE, 10.0) == 10.0   # less than its own
    assert TightestPrompt().room(LATENCY, DECODE, 0.3) == 0.3


def _long_prompt_beside_decodes(tightest: TightestPrompt | None):
    """A chunked multiplexing worker with three decodes under a loose TPOT SLO (1 s) and a long
    multiplexed prompt queued."""
    rules = BatchRules(prefill_first=False, chunked=True, token_budget=100_000,
                       tpot_guard=SlackRule.ITERATION, tightest=tightest)
    worker = make_worker(Role.MULTIPLEX, rules=rules)
    for i in range(3):
        start_decoding(worker, make_request(100 + i, output=50, tpot=1.0))
    long = make_request(1, prompt=40_000, ttft=60.0, tpot=1.0)
    long.path = PrefillPath.MULTIPLEX
    worker.enqueue(long)
    return worker


def test_a_multiplexing_batch_ends_within_the_room_the_tightest_leaves_and_else_within_the_tpot_slo():
    free = _long_prompt_beside_decodes(None)
    loose = free.latency.iteration_time(form_batch(free).shape)
    assert 0.9 < loose <= 1.0
    decode = BatchShape.decode(3, free.decode_context)
    tight = TightestPrompt(ttft=0.25, prompt_len=50)
    room = tight.room(free.latency, decode, 1.0)
    assert room < 0.25
    capped = _long_prompt_beside_decodes(tight)
    batch = form_batch(capped)
    assert batch.prefills and 0.9 * room < capped.latency.iteration_time(batch.shape) <= room


def _short_prompts_attained(cap: bool) -> tuple[int, float]:
    """Synthetic's first 400 requests at TPOT 20x: its prompts of at most 100 tokens attained,
    and the attainment of all."""
    cfg = replace(SimConfig(trace="synthetic", limit=400).with_preset(), tpot_scale=20.0,
                  iteration_cap=cap)
    result = simulate(experiment(cfg).with_policy("tropical+").at_rate(0.5))
    short = [r for r in result.requests if r.prompt_len <= 100]
    return sum(miss_cause(r) is None for r in short), result.summary.attainment


def test_under_a_loose_tpot_slo_the_shortest_prompts_are_served_in_time_with_the_cap():
    with_cap, without = _short_prompts_attained(True), _short_prompts_attained(False)
    assert with_cap[0] > without[0] and with_cap[1] > without[1]
