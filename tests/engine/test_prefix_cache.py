"""The engine's prefix cache (vLLM's design): cached prompt blocks are reused, never change an
output, stay valid after their request leaves, and are evicted only when room is needed."""

from __future__ import annotations

import pytest
import torch

from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.engine.batch import FlatBatch
from tropical.engine.block_hash import block_hashes
from tropical.engine.block_pool import BlockPool
from tropical.engine.config import ModelConfig
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.kv_events import BlockRemoved, BlockStored, follow, replay
from tropical.engine.model import LlamaModel
from tropical.engine.runner import EngineWorker, FinishedRequest
from tropical.engine.sampling import SamplingParams
from tropical.sched.prefix_cache import PrefixCache
from tropical.sched.rules import BatchRules
from tropical.sched.step import Span

CONFIG = ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, intermediate_size=128, vocab_size=96, max_position_embeddings=512)
BLOCK = 4


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel(CONFIG).eval()


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, CONFIG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _worker(model: LlamaModel, cached: bool, blocks: int = 64, rules: BatchRules | None = None
            ) -> EngineWorker:
    return EngineWorker(model, PagedKVCache(model.config, blocks, BLOCK), rules, prefix_cache=cached)


def _run(worker: EngineWorker, prompts: list[list[int]], output: int = 5, rid: int = 0
         ) -> list[FinishedRequest]:
    """Each prompt alone, one after another (so each later one can hit what earlier ones left)."""
    done = []
    for i, prompt in enumerate(prompts):
        worker.submit(Request(rid + i, 0.0, len(prompt), output, SLO(1.0, 1.0)), prompt, SamplingParams())
        finished: list[FinishedRequest] = []
        while worker.has_work:
            finished += worker.step(0.0).finished
        done += finished
    return done


SHARED = _prompt(23, 1)
FOLLOW_UPS = [SHARED, SHARED + _prompt(9, 2), SHARED[:17] + _prompt(6, 3), SHARED]


@pytest.mark.parametrize("rules", [None, BatchRules(chunked=True, token_budget=8)], ids=["whole", "chunked"])
def test_greedy_outputs_are_the_same_with_and_without_the_cache(model: LlamaModel, rules: BatchRules | None
                                                                 ) -> None:
    on = _run(_worker(model, True, rules=rules), FOLLOW_UPS)
    off = _run(_worker(model, False, rules=rules), FOLLOW_UPS)
    assert [f.token_ids for f in on] == [f.token_ids for f in off]
    assert [f.req.cached for f in on] == [0, 20, 16, 20]
    assert [f.req.cached for f in off] == [0, 0, 0, 0]


def test_logits_with_a_cached_prefix_match_a_full_prefill(model: LlamaModel) -> None:
    first, second = SHARED, SHARED[:16] + _prompt(7, 4)
    warm = PagedKVCache(CONFIG, 32, BLOCK)
    _forward(model, warm, Span("a", first, 0, block_hashes(first, BLOCK)))
    warm.free("a")
    hashes = block_hashes(second, BLOCK)
    cached = _forward(model, warm, Span("b", second[16:], 16, hashes))
    fresh = _forward(model, PagedKVCache(CONFIG, 32, BLOCK), Span("b", second, 0, hashes))
    assert (cached - fresh).abs().max() <= 1e-4


def _forward(model: LlamaModel, cache: PagedKVCache, span: Span) -> torch.Tensor:
    with torch.no_grad():
        logits = model(FlatBatch.build([span], cache), cache)
    cache.store(span.seq_id, span.total, span.block_hashes)
    return logits


def test_a_prompt_differing_in_its_first_token_hits_nothing(model: LlamaModel) -> None:
    other = [(SHARED[0] + 1) % CONFIG.vocab_size, *SHARED[1:]]
    assert not set(block_hashes(other, BLOCK)) & set(block_hashes(SHARED, BLOCK))
    done = _run(_worker(model, True), [SHARED, other])
    assert [f.req.cached for f in done] == [0, 0]


def test_a_hit_stops_one_token_short_of_the_prompt(model: LlamaModel) -> None:
    whole = _prompt(16, 5)
    on = _run(_worker(model, True), [whole, whole])
    assert [f.req.cached for f in on] == [0, 12]
    assert on[0].token_ids == on[1].token_ids


def test_a_one_token_prompt_caches_nothing_and_works(model: LlamaModel) -> None:
    worker = _worker(model, True)
    done = _run(worker, [[7], [7]])
    assert [f.req.cached for f in done] == [0, 0] and done[0].token_ids == done[1].token_ids
    assert worker.cache.cached_hashes == set() and worker.cache.used_blocks == 0


def test_an_aborted_request_releases_its_blocks_and_its_cached_ones_stay_valid(model: LlamaModel) -> None:
    worker = _worker(model, True, rules=BatchRules(chunked=True, token_budget=12))
    worker.submit(Request(0, 0.0, len(SHARED), 5, SLO(1.0, 1.0)), SHARED, SamplingParams())
    worker.step(0.0)                                      # the first 12 tokens: 3 blocks cached
    req = worker.cluster.workers[0].waiting[0]
    worker.cluster.abort(req.id, 0.0)
    worker.sequences.pop(req.id)
    worker.executor.free([req.id])
    assert worker.cache.used_blocks == 0 and worker.state.kv.used_blocks == 0
    assert len(worker.cache.cached_hashes) == 3 and not any(worker.cache.pool.refs)
    again = _run(worker, [SHARED], rid=1)
    assert again[0].req.cached == 12
    assert again[0].token_ids == _run(_worker(model, False), [SHARED])[0].token_ids


def test_a_flood_of_distinct_prompts_stays_within_the_cache_and_evicts_only_free_blocks(model: LlamaModel
                                                                                       ) -> None:
    worker = _worker(model, True, blocks=24, rules=BatchRules(chunked=True, token_budget=16))
    prompts = [_prompt(9 + i % 7, 100 + i) for i in range(30)]
    for i, prompt in enumerate(prompts):
        worker.submit(Request(i, 0.0, len(prompt), 4, SLO(1.0, 1.0)), prompt, SamplingParams())
    events, outputs = [], {}
    while worker.has_work:
        report = worker.step(0.0)
        outputs.update((f.req.id, f.token_ids) for f in report.finished)
        events += worker.cache.take_events()
        assert worker.cache.used_blocks <= worker.cache.num_blocks
        _check_no_block_in_use_is_cached_free(worker)
    assert any(isinstance(e, BlockRemoved) for e in events), "the flood never needed an eviction"
    alone = _run(_worker(model, False), prompts, output=4)
    assert [outputs[i] for i in range(len(prompts))] == [f.token_ids for f in alone]


def _check_no_block_in_use_is_cached_free(worker: EngineWorker) -> None:
    pool = worker.cache.pool
    for rid in worker.sequences:
        if worker.cache.has(rid):
            assert all(pool.refs[b] > 0 for b in worker.cache.block_table(rid))


def test_kv_events_replayed_give_the_engines_cache_and_the_schedulers_model_stays_within_it(
        model: LlamaModel) -> None:
    worker = _worker(model, True, blocks=20)
    events = []
    for i, prompt in enumerate([*FOLLOW_UPS, _prompt(30, 9), _prompt(30, 10), SHARED]):
        _run(worker, [prompt], rid=i)
        events += worker.cache.take_events()
        assert replay(events) == worker.cache.cached_hashes
        assert set(worker.state.kv.cache.entries) <= worker.cache.cached_hashes
    assert {type(e) for e in events} == {BlockStored, BlockRemoved}


def test_blocks_computed_twice_at_once_end_up_shared() -> None:
    pool = BlockPool(8, BLOCK)
    names = block_hashes(list(range(8)), BLOCK)
    a, b = pool.allocate(2), pool.allocate(2)
    pool.store(a, 0, names)
    pool.store(b, 0, names)
    assert b == a and [pool.refs[x] for x in a] == [2, 2] and pool.num_free == 6
    assert pool.take_events() == [BlockStored(names, None, BLOCK)]


def test_freed_blocks_are_evicted_least_recently_freed_and_tail_first() -> None:
    pool = BlockPool(4, BLOCK)
    names = block_hashes(list(range(12)), BLOCK)
    table = pool.allocate(3)
    pool.store(table, 0, names)
    pool.free(table[::-1])
    pool.allocate(1)                                        # a plain free block: nothing evicted
    assert pool.cached_hashes == set(names)
    pool.allocate(2)
    assert pool.cached_hashes == {names[0]}
    assert pool.take_events()[-1] == BlockRemoved((names[2], names[1]))


def test_a_model_following_the_events_drops_what_the_worker_evicted_and_keeps_what_it_stored_again() -> None:
    pool = BlockPool(2, BLOCK)
    names = block_hashes(list(range(8)), BLOCK)
    model = PrefixCache(BLOCK)
    req = Request(0, 0.0, 8, 1, SLO(1.0, 1.0), prefix=names, prefix_block=BLOCK)
    model.store(req, 8)
    model.release(req)
    first = pool.allocate(2)
    pool.store(first, 0, names)
    pool.free(first[::-1])
    again = pool.allocate(2)                                   # evicts both, then stores the first again
    pool.store(again, 0, names[:1])
    assert follow(model, pool.take_events()) == []
    assert set(model.entries) == {names[0]} == pool.cached_hashes
    assert model.free_blocks == 1


def test_migrated_kv_lands_after_the_targets_cached_prefix_and_enters_its_cache(model: LlamaModel) -> None:
    prompt = SHARED
    hashes = block_hashes(prompt, BLOCK)
    source, target = PagedKVCache(CONFIG, 32, BLOCK), PagedKVCache(CONFIG, 32, BLOCK)
    _forward(model, source, Span("a", prompt, 0, hashes))
    _forward(model, target, Span("old", prompt[:8], 0, hashes[:2]))
    target.free("old")
    target.import_("a", source.export("a", len(prompt) - 8, start=8), start=8, block_hashes=hashes)
    assert target.cached_hashes == set(hashes) and target.used_blocks == len(target.block_table("a"))
    step = Span("a", [5], len(prompt))
    assert (_forward(model, target, step) - _forward(model, source, step)).abs().max() <= 1e-4


def test_an_import_refuses_a_prefix_its_target_does_not_hold() -> None:
    cache = PagedKVCache(CONFIG, 8, BLOCK)
    buffer = torch.zeros(CONFIG.num_hidden_layers, 2, 4, CONFIG.num_key_value_heads, CONFIG.head_dim)
    with pytest.raises(ValueError, match="only 0 of its prompt are cached"):
        cache.import_("a", buffer, start=8, block_hashes=block_hashes(list(range(12)), BLOCK))
    assert cache.used_blocks == 0 and not cache.has("a")


def test_a_target_holding_the_whole_prompt_imports_nothing(model: LlamaModel) -> None:
    prompt = SHARED[:16]
    hashes = block_hashes(prompt, BLOCK)
    source, target = PagedKVCache(CONFIG, 32, BLOCK), PagedKVCache(CONFIG, 32, BLOCK)
    _forward(model, source, Span("a", prompt, 0, hashes))
    _forward(model, target, Span("old", prompt, 0, hashes))
    target.free("old")
    target.import_("a", source.export("a", 0, start=16), start=16, block_hashes=hashes)
    assert target.used_blocks == 4 and target.cached_hashes == set(hashes)
