"""EngineWorker runs sched's batches for real: batching and chunking never change greedy tokens."""

from __future__ import annotations

import pytest
import torch

from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.engine.config import ModelConfig
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.model import LlamaModel
from tropical.engine.runner import EngineWorker, FinishedRequest, IterationReport
from tropical.engine.sampling import SamplingParams
from tropical.sched.rules import BatchRules

CONFIG = ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, intermediate_size=128, vocab_size=96, max_position_embeddings=256)
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel(CONFIG).eval()


def _worker(model: LlamaModel, rules: BatchRules | None = None, eos: frozenset[int] = frozenset()
            ) -> EngineWorker:
    return EngineWorker(model, PagedKVCache(model.config, num_blocks=64, block_size=4), rules, eos_ids=eos)


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, CONFIG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _request(rid: int, prompt: int, output: int) -> Request:
    return Request(rid, 0.0, prompt, output, SLO(1.0, 1.0))


def _drain(worker: EngineWorker) -> tuple[dict[int, FinishedRequest], list[IterationReport]]:
    finished, reports, now = {}, [], 0.0
    while worker.has_work:
        report = worker.step(now)
        now += report.duration
        reports.append(report)
        finished.update((f.req.id, f) for f in report.finished)
        assert len(reports) < 500, "worker made no progress"
    return finished, reports


def _generate(model: LlamaModel, jobs: list[tuple[int, int, int]], rules: BatchRules | None = None
              ) -> dict[int, list[int]]:
    """jobs: (prompt length, max tokens, prompt seed); all submitted together."""
    worker = _worker(model, rules)
    for rid, (prompt, output, seed) in enumerate(jobs):
        worker.submit(_request(rid, prompt, output), _prompt(prompt, seed), GREEDY)
    finished, _ = _drain(worker)
    return {rid: f.token_ids for rid, f in finished.items()}


JOBS = [(13, 6, 1), (7, 9, 2), (21, 4, 3)]


def test_batched_matches_alone(model: LlamaModel) -> None:
    together = _generate(model, JOBS)
    alone = [_generate(model, [job])[0] for job in JOBS]
    assert [together[i] for i in range(len(JOBS))] == alone
    assert [len(t) for t in alone] == [output for _, output, _ in JOBS]


def test_staggered_arrival_mixes_prefill_and_decode(model: LlamaModel) -> None:
    worker = _worker(model)
    worker.submit(_request(0, 13, 6), _prompt(13, 1), GREEDY)
    first = worker.step(0.0)
    worker.submit(_request(1, 7, 9), _prompt(7, 2), GREEDY)
    mixed = worker.step(first.duration)
    assert (first.decode_count, mixed.decode_count, mixed.shape.num_prefills) == (0, 1, 1)
    finished, _ = _drain(worker)
    assert finished[0].token_ids == _generate(model, [JOBS[0]])[0]
    assert finished[1].token_ids == _generate(model, [JOBS[1]])[0]


def test_chunked_prefill_matches_unchunked(model: LlamaModel) -> None:
    chunked = _generate(model, JOBS, BatchRules(chunked=True, token_budget=8))
    assert chunked == _generate(model, JOBS)


def test_finish_at_max_tokens_frees_kv(model: LlamaModel) -> None:
    worker = _worker(model)
    worker.submit(_request(0, 10, 3), _prompt(10, 4), GREEDY)
    finished, reports = _drain(worker)
    assert len(reports) == 3 and finished[0].reason == "length" and len(finished[0].token_ids) == 3
    assert worker.cache.used_blocks == 0 and worker.state.kv.used_blocks == 0
    assert not worker.cache.has(0) and not worker.state.holds and not worker.sequences
    assert finished[0].req.generated == 3 and finished[0].req.finish is not None


def test_single_token_request(model: LlamaModel) -> None:
    worker = _worker(model)
    worker.submit(_request(0, 5, 1), _prompt(5, 5), GREEDY)
    finished, reports = _drain(worker)
    assert len(reports) == 1 and len(finished[0].token_ids) == 1 and worker.cache.used_blocks == 0


def test_eos_finishes_early_and_frees_kv(model: LlamaModel) -> None:
    full = _generate(model, [(13, 6, 1)])[0]
    eos = full[2]
    worker = _worker(model, eos=frozenset({eos}))
    worker.submit(_request(0, 13, 6), _prompt(13, 1), GREEDY)
    worker.submit(_request(1, 7, 9), _prompt(7, 2), GREEDY)
    finished, _ = _drain(worker)
    stop = full.index(eos) + 1
    assert finished[0].reason == "eos" and finished[0].token_ids == full[:stop]
    assert finished[0].req.generated == stop
    assert worker.cache.used_blocks == 0 and worker.state.kv.used_blocks == 0
    assert worker.state.running_remaining == 0 and worker.state.decode_context == 0


def test_report_fields_consistent(model: LlamaModel) -> None:
    worker = _worker(model, BatchRules(chunked=True, token_budget=8))
    for rid, (prompt, output, seed) in enumerate(JOBS):
        worker.submit(_request(rid, prompt, output), _prompt(prompt, seed), GREEDY)
    _, reports = _drain(worker)
    assert sum(r.prefill_tokens for r in reports) == sum(p for p, _, _ in JOBS)
    assert sum(r.decode_count for r in reports) == sum(o - 1 for _, o, _ in JOBS)
    assert sum(len(r.finished) for r in reports) == len(JOBS)
    for r in reports:
        assert r.duration > 0 and r.shape.tokens == r.prefill_tokens + r.decode_count <= 8
        assert r.shape.prefill_tokens == r.prefill_tokens and r.shape.decode_count == r.decode_count
        assert 0 <= r.kv_blocks_used <= r.kv_blocks_total == 64
    assert (reports[-1].waiting, reports[-1].running, reports[-1].kv_blocks_used) == (0, 0, 0)


def test_submit_rejects_mismatched_prompt(model: LlamaModel) -> None:
    with pytest.raises(ValueError, match="prompt ids"):
        _worker(model).submit(_request(0, 5, 2), [1, 2, 3], GREEDY)
