"""Cluster descriptions: which replicas exist, on what GPUs, priced by which latency model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.noisy import NoisyModel
from tropical.core.specs import ReplicaSpec, hardware
from tropical.models import load_model_spec
from tropical.sched.fleet import worker_states
from tropical.sched.host_store import HostStore
from tropical.sched.policy import Policy
from tropical.sched.worker import WorkerState


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One replica, the latency model that prices its iterations, and optionally a KV size."""

    replica: ReplicaSpec
    latency: LatencyModel
    kv_tokens: int | None = None

    @property
    def kv_capacity_tokens(self) -> int:
        return self.replica.kv_capacity_tokens if self.kv_tokens is None else self.kv_tokens


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Workers in order; the first is the reference replica SLOs are priced on."""

    name: str
    workers: tuple[WorkerSpec, ...]
    block_size: int = 16

    def __post_init__(self) -> None:
        if len(self.workers) < 1:
            raise ValueError("a cluster needs at least one worker")

    @property
    def reference(self) -> LatencyModel:
        return self.workers[0].latency

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV one token holds on the reference replica (what a migration moves)."""
        return self.workers[0].replica.model.kv_bytes_per_token

    @property
    def max_context(self) -> int:
        return min(w.replica.model.max_context for w in self.workers)

    def build(self, policy: Policy, predictor_noise: float = 0.0, seed: int = 0,
              predictor_bias: float = 0.0, prefix_cache: bool = False,
              host_kv: float = 0.0, host_shared: bool = False) -> list[WorkerState]:
        """Fresh worker states with the policy's roles and batch rules.

        Their ``latency`` is what the policy predicts with: the true model, or the true model
        with ``predictor_noise`` relative error and ``predictor_bias`` systematic error (see
        ``NoisyModel``), corrected online where the policy learns from its iterations. With
        ``prefix_cache`` each worker keeps the prompts it computed for reuse (vLLM's automatic
        prefix caching), with ``host_kv`` times its KV pool in host memory where that is not 0:
        its own, or pooled into one store that every worker loads from (``host_shared``).
        """
        roles = policy.roles(len(self.workers))
        pools = [(spec.kv_capacity_tokens // self.block_size, self.block_size) for spec in self.workers]
        predictors = [_predictor(spec.latency, predictor_noise, predictor_bias, seed + i)
                      for i, spec in enumerate(self.workers)]
        workers = worker_states(policy, roles, pools, predictors, prefix_cache)
        if host_kv:
            pooled = int(host_kv * sum(blocks for blocks, _ in pools))
            shared = HostStore(pooled, shared=True) if host_shared else None
            for worker, spec, (blocks, _) in zip(workers, self.workers, pools, strict=True):
                store = shared if shared is not None else HostStore(int(host_kv * blocks))
                worker.add_host_tier(store, spec.replica.host_load_seconds_per_token)
        return workers

    @property
    def truth(self) -> list[LatencyModel]:
        return [spec.latency for spec in self.workers]


def _predictor(truth: LatencyModel, noise: float, bias: float, seed: int) -> LatencyModel:
    return NoisyModel(truth, noise, seed, bias) if noise or bias else truth


LatencyFactory = Callable[[ReplicaSpec], LatencyModel]


def replicas(name: str, model: str, gpus: list[str], tp: int, latency: LatencyFactory,
             memory_utilization: float = 0.9) -> ClusterSpec:
    """One replica of ``model`` on ``tp`` GPUs per entry of ``gpus`` (kinds may differ), each
    priced by its own latency model."""
    spec = load_model_spec(model)
    built: dict[str, WorkerSpec] = {}
    for gpu in set(gpus):
        replica = ReplicaSpec(spec, hardware(gpu), tp, memory_utilization)
        built[gpu] = WorkerSpec(replica, latency(replica))
    return ClusterSpec(name, tuple(built[gpu] for gpu in gpus))
