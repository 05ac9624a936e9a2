"""The worker states a policy runs on, built here for every substrate: the simulator's clusters,
our engine's workers, vLLM instances and the fidelity twin of a server run."""

from __future__ import annotations

from collections.abc import Sequence

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.online import OnlineLatency
from tropical.sched.policy import Policy
from tropical.sched.prefix_directory import PrefixDirectory
from tropical.sched.rules import Role
from tropical.sched.worker import WorkerState, worker_state


def worker_states(policy: Policy, roles: Sequence[Role], pools: Sequence[tuple[int, int]],
                  predictors: Sequence[LatencyModel], prefix_cache: bool = False,
                  online: bool | None = None) -> list[WorkerState]:
    """Fresh states, worker ``i`` with ``roles[i]`` and the policy's batch rules for it, a KV pool
    of ``pools[i]`` (blocks, block size) and ``predictors[i]`` to price its iterations, corrected
    online (``OnlineLatency``) where the policy learns from its iterations, or wherever ``online``
    says. With ``prefix_cache`` each worker keeps the prompts it computed for reuse, and, where
    the policy keeps one (``Policy.keeps_directory``), one directory says which workers hold each
    prefix block."""
    learns = policy.learns_latency if online is None else online
    directory = PrefixDirectory() if prefix_cache and policy.keeps_directory(roles) else None
    return [worker_state(i, role, policy.rules(role), blocks, block_size,
                         OnlineLatency(predictor) if learns else predictor, prefix_cache, directory)
            for i, (role, (blocks, block_size), predictor)
            in enumerate(zip(roles, pools, predictors, strict=True))]
