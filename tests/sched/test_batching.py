from tests.factories import make_request, make_worker, migrate_in, start_decoding
from tropical.core.latency.shape import BatchShape, attention_pairs
from tropical.core.request import PrefillPath
from tropical.sched.batching import form_batch
from tropical.sched.rules import BatchRules, Role
from tropical.sched.slack import SlackRule

CHUNKED = BatchRules(prefill_first=False, chunked=True, token_budget=2048)
COLOCATED = BatchRules(prefill_first=True, token_budget=100_000)


def decoding_worker(rules, n_decoding=3):
    worker = make_worker(rules=rules)
    for i in range(n_decoding):
        req = make_request(100 + i, output=50)
        start_decoding(worker, req)
    return worker


def test_colocated_runs_waiting_prefills_alone_first():
    worker = decoding_worker(COLOCATED)
    worker.enqueue(make_request(1, prompt=500))
    batch = form_batch(worker)
    assert [(r.id, new, cached) for r, new, cached in batch.prefills] == [(1, 500, 0)]
    assert batch.decode_count == 0


def test_colocated_decodes_when_no_prefill_waits():
    batch = form_batch(decoding_worker(COLOCATED))
    assert batch.decode_only and batch.decode_count == 3


def test_chunked_puts_decodes_first_then_chunks_under_the_budget():
    worker = decoding_worker(CHUNKED)
    worker.enqueue(make_request(1, prompt=5000))
    batch = form_batch(worker)
    assert batch.decode_count == 3
    assert [(new, cached) for _, new, cached in batch.prefills] == [(2045, 0)]


def test_chunked_prefill_attention_cost_grows_with_cached_tokens():
    worker = make_worker(rules=CHUNKED)
    req = make_request(1, prompt=6000, output=2)
    worker.enqueue(req)
    shapes = []
    while req.first_token is None:
        batch = form_batch(worker)
        shapes.append(batch.shape)
        for r, new, _ in batch.prefills:
            worker.complete_prefill(r, new, now=0.0)
    assert [s.prefill_cached for s in shapes] == [0, 2048, 4096]
    assert shapes[1].prefill_pairs == attention_pairs(2048, 2048)
    pairs = [s.prefill_pairs for s in shapes[:2]]
    assert pairs[1] > pairs[0]
    times = [worker.latency.iteration_time(s) for s in shapes[:2]]
    assert times[1] > times[0]


def test_prompt_that_does_not_fit_blocks_the_queue_behind_it():
    worker = make_worker(rules=COLOCATED, kv_tokens=1000)
    worker.enqueue(make_request(1, prompt=990, output=20))
    worker.enqueue(make_request(2, prompt=10, output=2))
    assert form_batch(worker).is_empty
    assert worker.kv.used_blocks == 0


def test_sequence_cap_limits_new_prefills():
    worker = decoding_worker(BatchRules(prefill_first=False, token_budget=10_000, max_seqs=4))
    for i in range(3):
        worker.enqueue(make_request(10 + i, prompt=10))
    assert len(form_batch(worker).prefills) == 1


def test_prefill_worker_batches_prompts_up_to_its_budget():
    worker = make_worker(Role.PREFILL, rules=BatchRules(prefill_first=True, token_budget=250))
    for i in range(4):
        worker.enqueue(make_request(i, prompt=100))
    batch = form_batch(worker)
    assert [r.id for r, _, _ in batch.prefills] == [0, 1]
    assert batch.decode_count == 0


def test_chunked_multiplexing_cuts_a_long_prompt_to_the_largest_chunk_the_slack_admits():
    rules = BatchRules(prefill_first=False, chunked=True, token_budget=8192,
                       tpot_guard=SlackRule.ITERATION)
    worker = make_worker(Role.MULTIPLEX, rules=rules)
    for i in range(3):
        start_decoding(worker, make_request(100 + i, output=50, tpot=0.1))
    long = make_request(1, prompt=6000)
    long.path = PrefillPath.MULTIPLEX
    worker.enqueue(long)
    (req, chunk, cached), = form_batch(worker).prefills
    decodes = BatchShape.decode(3, worker.decode_context)
    assert req is long and cached == 0 and 1 <= chunk < 6000
    assert worker.latency.iteration_time(decodes.plus_prefill(chunk, 0)) <= 0.1
    assert worker.latency.iteration_time(decodes.plus_prefill(chunk + 1, 0)) > 0.1


def test_unchunked_multiplexing_leaves_a_prompt_that_breaks_the_slack_for_later():
    rules = BatchRules(prefill_first=False, token_budget=8192, tpot_guard=SlackRule.ITERATION)
    worker = make_worker(Role.MULTIPLEX, rules=rules)
    start_decoding(worker, make_request(100, output=50, tpot=0.1))
    long = make_request(1, prompt=6000)
    long.path = PrefillPath.MULTIPLEX
    worker.enqueue(long)
    batch = form_batch(worker)
    assert batch.decode_only


def _multiplexing_worker_with(decoding_since: float):
    """A chunked multiplexing worker where one request decodes whose KV migrated in after its
    first token at ``decoding_since`` (TPOT SLO 0.1 s), and a long multiplexed prompt queued."""
    rules = BatchRules(prefill_first=False, chunked=True, token_budget=8192,
                       tpot_guard=SlackRule.ITERATION)
    worker = make_worker(Role.MULTIPLEX, rules=rules)
    migrate_in(worker, make_request(100, output=50, tpot=0.1), first_token=decoding_since)
    long = make_request(1, prompt=6000)
    long.path = PrefillPath.MULTIPLEX
    worker.enqueue(long)
    return worker


def test_a_chunk_never_leaves_a_decode_behind_its_tpot_slo():
    """The decode's second token is due 0.1 s after its first; at 0.06 s the iteration may
    take only 0.04 s, not the whole SLO."""
    worker = _multiplexing_worker_with(decoding_since=0.0)
    batch = form_batch(worker, now=0.06)
    (_, chunk, _), = batch.prefills
    assert worker.latency.iteration_time(batch.shape) <= 0.04 + 1e-12
    longer = BatchShape.decode(1, worker.decode_context).plus_prefill(chunk + 1, 0)
    assert worker.latency.iteration_time(longer) > 0.04
    assert not batch.held


def test_a_decode_already_behind_holds_the_prompt_until_it_catches_up():
    """Past the second token's due time no chunk fits: the iteration decodes alone, and the
    batch says the next one may carry the prompt again (no request need finish for that)."""
    worker = _multiplexing_worker_with(decoding_since=0.0)
    batch = form_batch(worker, now=0.12)
    assert batch.decode_only and batch.held
    on_time = form_batch(_multiplexing_worker_with(decoding_since=0.12), now=0.12)
    assert on_time.prefills and not on_time.held


def _short_then_long(spare: bool, short_ttft: float):
    """A chunked multiplexing worker with three decodes (TPOT SLO 0.1 s) and, queued in order,
    a short multiplexed prompt and a long one."""
    rules = BatchRules(prefill_first=False, chunked=True, token_budget=8192,
                       tpot_guard=SlackRule.ITERATION, spare_finishing=spare)
    worker = make_worker(Role.MULTIPLEX, rules=rules)
    for i in range(3):
        start_decoding(worker, make_request(100 + i, output=50, tpot=0.1))
    short, long = make_request(1, prompt=200, ttft=short_ttft), make_request(2, prompt=6000, ttft=60.0)
    for req in (short, long):
        req.path = PrefillPath.MULTIPLEX
        worker.enqueue(req)
    return worker, short, long


def test_an_iteration_that_finishes_a_prompt_spares_it_a_later_chunk_that_would_cost_its_slo():
    worker, short, long = _short_then_long(spare=False, short_ttft=1.0)
    decodes = BatchShape.decode(3, worker.decode_context)
    alone = worker.latency.iteration_time(decodes.plus_prefill(200, 0))
    packed = form_batch(worker)
    assert [req for req, _, _ in packed.prefills] == [short, long]
    full = worker.latency.iteration_time(packed.shape)
    assert alone < full <= 0.1
    tight = (alone + full) / 2                       # met alone, missed with the chunk beside it
    for spare, expected in ((True, [1]), (False, [1, 2])):
        worker, _, _ = _short_then_long(spare, tight)
        assert [req.id for req, _, _ in form_batch(worker).prefills] == expected
    worker, _, _ = _short_then_long(spare=True, short_ttft=1.0)          # met either way
    assert [req.id for req, _, _ in form_batch(worker).prefills] == [1, 2]


def _short_then_whole(spare: bool, short_ttft: float, tpot: float = 1.0):
    """A chunked multiplexing worker with three decodes (a loose TPOT SLO, so that one iteration
    holds several whole prompts) and, queued in order, a short multiplexed prompt and two of
    600 tokens."""
    rules = BatchRules(prefill_first=False, chunked=True, token_budget=8192,
                       tpot_guard=SlackRule.ITERATION, spare_finishing=spare)
    worker = make_worker(Role.MULTIPLEX, rules=rules)
    for i in range(3):
        start_decoding(worker, make_request(100 + i, output=50, tpot=tpot))
    queued = [make_request(1, prompt=200, ttft=short_ttft, tpot=tpot)]
    queued += [make_request(rid, prompt=600, ttft=60.0, tpot=tpot) for rid in (2, 3)]
    for req in queued:
        req.path = PrefillPath.MULTIPLEX
        worker.enqueue(req)
    return worker


def test_an_iteration_that_finishes_a_prompt_spares_it_whole_prompts_behind_that_would_cost_its_slo():
    """The cut is before the first prompt, whole or a chunk, that would end the iteration after
    the deadline of a prompt it finishes in time: the whole prompts behind a short one wait an
    iteration as a chunk does; one the deadline leaves room for stays."""
    packed = form_batch(_short_then_whole(spare=False, short_ttft=10.0))
    assert [req.id for req, _, _ in packed.prefills] == [1, 2, 3]
    worker = _short_then_whole(spare=False, short_ttft=10.0)
    shape = BatchShape.decode(3, worker.decode_context)
    ends = []
    for new in (200, 600, 600):
        shape = shape.plus_prefill(new, 0)
        ends.append(worker.latency.iteration_time(shape))
    for deadline, kept in (((ends[0] + ends[1]) / 2, [1]), ((ends[1] + ends[2]) / 2, [1, 2]),
                           (10.0, [1, 2, 3])):
        batch = form_batch(_short_then_whole(spare=True, short_ttft=deadline))
        assert [req.id for req, _, _ in batch.prefills] == kept
        assert all(new == req.prompt_len for req, new, _ in batch.prefills)
