"""Builders for tests: a small, exactly known latency model, requests and workers."""

from __future__ import annotations

from tropical.core.latency.fitted import FittedModel
from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.core.specs import ReplicaSpec, hardware
from tropical.models import load_model_spec
from tropical.sched.kv import KVPool
from tropical.sched.rules import BatchRules, Role
from tropical.sched.worker import WorkerState
from tropical.sim.cluster import ClusterSpec, WorkerSpec


def linear_model(**overrides: float) -> FittedModel:
    """Round numbers: 10 ms + 0.1 ms/token prefill, 5 ms + 1 µs/context + 0.1 ms/seq decode."""
    coeffs = dict(prefill_intercept=0.01, prefill_per_token=1e-4, prefill_per_pair=1e-8,
                  decode_intercept=0.005, decode_per_context=1e-6, decode_per_seq=1e-4,
                  kv_bytes_per_token=1000.0, transfer_bandwidth=1e9, transfer_latency=1e-3)
    coeffs.update(overrides)
    return FittedModel(**coeffs)


def make_request(rid: int = 0, arrival: float = 0.0, prompt: int = 100, output: int = 10,
                 ttft: float = 1.0, tpot: float = 0.1) -> Request:
    return Request(rid, arrival, prompt, output, SLO(ttft, tpot))


def make_worker(role: Role = Role.COLOCATED, rules: BatchRules | None = None,
                kv_tokens: int = 100_000, wid: int = 0) -> WorkerState:
    return WorkerState(wid, role, rules or BatchRules(), KVPool.for_tokens(kv_tokens),
                       linear_model())


def start_decoding(worker: WorkerState, req: Request, now: float = 0.0) -> Request:
    """Queue, admit and prefill ``req`` on ``worker`` so that it decodes there from ``now``."""
    worker.enqueue(req)
    worker.reserve(req)
    worker.complete_prefill(req, req.prompt_len, now=now)
    return req


def migrate_in(worker: WorkerState, req: Request, first_token: float = 0.0) -> Request:
    """Land ``req``, prefilled elsewhere with its first token at ``first_token``, on ``worker``
    (room reserved, KV arrived) so that it decodes there from the next iteration."""
    req.computed, req.generated, req.first_token = req.prompt_len, 1, first_token
    worker.expect_migration(req)
    worker.arrive_migrated(req)
    worker.admit_inbox()
    return req


def linear_cluster(workers: int, kv_tokens: int) -> ClusterSpec:
    """``workers`` Llama-2-7B replicas on one A100 each, priced by ``linear_model``."""
    replica = ReplicaSpec(load_model_spec("llama-2-7b"), hardware("a100"), tp=1)
    return ClusterSpec("linear", (WorkerSpec(replica, linear_model(), kv_tokens),) * workers)
