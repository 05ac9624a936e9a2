"""The engine's sampling features end to end through EngineWorker on a tiny random model: prompt
logprobs over chunked prefill equal an unchunked prefill's and the model's own log-softmax; sampled
logprobs ride with their tokens; stop token ids and min_tokens end requests as vLLM ends them; a
grammar's mask holds every token; plain requests generate what they did before."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from tropical.core.request import Request
from tropical.core.sampling import SamplingParams
from tropical.core.slo import SLO
from tropical.engine.batch import FlatBatch
from tropical.engine.config import ModelConfig
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.model import LlamaModel
from tropical.engine.runner import EngineWorker, FinishedRequest
from tropical.sched.rules import BatchRules
from tropical.sched.step import Span

CONFIG = ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, intermediate_size=128, vocab_size=96, max_position_embeddings=256)
CHUNKED = BatchRules(chunked=True, token_budget=8)


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel(CONFIG).eval()


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, CONFIG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@dataclass
class OnlyTokens:
    """A grammar allowing only ``tokens``; records every token it is told of."""

    tokens: set[int]
    accepted: list[int] = field(default_factory=list)

    def allowed(self) -> bytes:
        words = [0] * -(-CONFIG.vocab_size // 32)
        for t in self.tokens:
            words[t // 32] |= 1 << (t % 32)
        return b"".join(w.to_bytes(4, "little") for w in words)

    def accept(self, token: int) -> None:
        self.accepted.append(token)


def run(model: LlamaModel, jobs: list[tuple[list[int], int, SamplingParams]], rules: BatchRules | None = None,
        eos: frozenset[int] = frozenset(), prefix_cache: bool = False, constraint: OnlyTokens | None = None
        ) -> tuple[EngineWorker, dict[int, FinishedRequest]]:
    worker = EngineWorker(model, PagedKVCache(model.config, num_blocks=64, block_size=4), rules, eos_ids=eos,
                          prefix_cache=prefix_cache)
    for rid, (ids, output, params) in enumerate(jobs):
        worker.submit(Request(rid, 0.0, len(ids), output, SLO(1.0, 1.0)), ids, params, constraint)
    finished: dict[int, FinishedRequest] = {}
    while worker.has_work:
        finished.update((f.req.id, f) for f in worker.step(0.0).finished)
    return worker, finished


def full_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """Every position's logits of one unchunked prefill (the model's ``also`` positions)."""
    cache = PagedKVCache(model.config, num_blocks=16, block_size=4)
    batch = FlatBatch.build([Span(0, ids, 0)], cache)
    return model(batch, cache, list(range(len(ids))))[1:]


def test_prompt_logprobs_over_chunks_equal_an_unchunked_prefill(model: LlamaModel) -> None:
    ids = prompt(21, 1)
    params = SamplingParams(prompt_logprobs=3)
    jobs = [(ids, 3, params), (prompt(13, 2), 3, SamplingParams())]
    _, whole = run(model, jobs)
    _, chunked = run(model, jobs, CHUNKED)
    reference = full_logits(model, ids).log_softmax(-1)
    for scored in (whole[0].prompt_logprobs, chunked[0].prompt_logprobs):
        assert [s.token for s in scored] == ids[1:]
        assert [s.logprob for s in scored] == pytest.approx(
            [float(reference[p, t]) for p, t in enumerate(ids[1:])], abs=1e-5)
        assert all(len(s.top) == 3 and s.rank == int((reference[p] >= reference[p, s.token]).sum())
                   for p, s in enumerate(scored))
    assert whole[0].token_ids == chunked[0].token_ids and not whole[1].prompt_logprobs


def test_sampled_logprobs_ride_with_their_tokens(model: LlamaModel) -> None:
    ids = prompt(9, 3)
    _, done = run(model, [(ids, 4, SamplingParams(logprobs=2))])
    tokens, scored = done[0].token_ids, done[0].logprobs
    assert [s.token for s in scored] == tokens and all(s.rank == 1 for s in scored)
    reference = full_logits(model, ids + tokens[:-1])[len(ids) - 1:].log_softmax(-1)
    assert [s.logprob for s in scored] == pytest.approx(
        [float(reference[i, t]) for i, t in enumerate(tokens)], abs=1e-5)
    assert [s.top[0][0] for s in scored] == tokens


def test_stop_token_ids_end_a_request_but_not_before_min_tokens(model: LlamaModel) -> None:
    ids = prompt(13, 1)
    _, plain = run(model, [(ids, 8, SamplingParams())])
    free = plain[0].token_ids
    stop = free[2]
    _, stopped = run(model, [(ids, 8, SamplingParams(stop_token_ids=(stop,)))])
    assert stopped[0].reason == "eos" and stopped[0].token_ids == free[:free.index(stop) + 1]
    _, held = run(model, [(ids, 8, SamplingParams(stop_token_ids=(stop,), min_tokens=6))])
    assert stop not in held[0].token_ids[:6]
    _, eos_held = run(model, [(ids, 8, SamplingParams(min_tokens=6))], eos=frozenset({stop}))
    assert stop not in eos_held[0].token_ids[:6]


def test_a_grammar_holds_every_token_and_hears_of_each(model: LlamaModel) -> None:
    grammar = OnlyTokens({5, 17, 60})
    _, done = run(model, [(prompt(11, 4), 6, SamplingParams(temperature=1.0, seed=3))], constraint=grammar)
    assert set(done[0].token_ids) <= grammar.tokens and grammar.accepted == done[0].token_ids


def test_prompt_logprob_requests_read_no_cached_prefix(model: LlamaModel) -> None:
    ids = prompt(16, 5)
    worker, _ = run(model, [(ids, 2, SamplingParams())], prefix_cache=True)
    worker.submit(Request(7, 0.0, 16, 2, SLO(1.0, 1.0)), ids, SamplingParams(prompt_logprobs=0))
    worker.submit(Request(8, 0.0, 16, 2, SLO(1.0, 1.0)), ids, SamplingParams())
    finished = {}
    while worker.has_work:
        finished.update((f.req.id, f) for f in worker.step(0.0).finished)
    assert finished[7].req.cached == 0 and len(finished[7].prompt_logprobs) == 15
    assert finished[8].req.cached > 0


def test_plain_requests_generate_as_before(model: LlamaModel) -> None:
    """The greedy and seeded tokens of plain requests equal those of the same requests asking for
    logprobs 0 (the processing path); logprobs change nothing they sample."""
    jobs = [(prompt(13, 1), 6, SamplingParams()), (prompt(7, 2), 6, SamplingParams(temperature=0.8, seed=4))]
    _, plain = run(model, jobs)
    _, scored = run(model, [(ids, n, SamplingParams(temperature=p.temperature, seed=p.seed, logprobs=0))
                            for ids, n, p in jobs])
    assert [plain[i].token_ids for i in range(2)] == [scored[i].token_ids for i in range(2)]
    assert not plain[0].logprobs and len(scored[1].logprobs) == 6
