"""A fleet sharded into pools: a front router in front of one policy per pool (DESIGN.md §6).

One router cannot decide for thousands of workers at every iteration end; a fleet beyond one
router runs as pools of tens of workers, each with its own policy (its own toggle) that sees
only its pool, behind a front router that sees each pool as a whole. The front router is
cache- and load-aware as Dynamo's and llm-d's are: a request goes to the least loaded pool
(unfinished tokens per live worker) unless another holds a longer run of its prefix blocks at
a load per worker at most one prompt above it. Each pool's policy decides within the pool
exactly as it would for a cluster of that size, and a prompt decodes in the pool that
prefilled it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tropical.core.request import Request
from tropical.sched.policy import Assignment, Policy
from tropical.sched.rules import BatchRules, Role
from tropical.sched.worker import WorkerState


class PooledPolicy(Policy):
    """``pools`` policies over consecutive, equal shares of the workers, behind a front router."""

    routes_by_prefix = True
    """The front router sends each request where its prefix is held."""

    def __init__(self, pools: Sequence[Policy], name: str) -> None:
        if not pools:
            raise ValueError("a pooled fleet needs at least one pool")
        self.pools = list(pools)
        self.name = name
        self.observes_iterations = any(p.observes_iterations for p in self.pools)
        self._members: list[range] = []
        self._views: list[list[WorkerState]] = []
        self._seen: Sequence[WorkerState] | None = None

    def roles(self, num_workers: int) -> list[Role]:
        if num_workers < len(self.pools):
            raise ValueError(f"{num_workers} workers cannot form {len(self.pools)} pools")
        size, extra = divmod(num_workers, len(self.pools))
        self._members, start = [], 0
        for i in range(len(self.pools)):
            count = size + (i < extra)
            self._members.append(range(start, start + count))
            start += count
        return [role for pool, members in zip(self.pools, self._members, strict=True)
                for role in pool.roles(len(members))]

    def rules(self, role: Role) -> BatchRules:
        return self.pools[0].rules(role)

    @property
    def learns_latency(self) -> bool:
        return self.pools[0].learns_latency

    def roster_changed(self) -> None:
        self._seen = None
        for pool in self.pools:
            pool.roster_changed()

    def on_arrival(self, req: Request, now: float,
                   workers: Sequence[WorkerState]) -> list[Assignment]:
        views = self._pool_views(workers)
        chosen = self._front(req, views)
        return self.pools[chosen].on_arrival(req, now, views[chosen])

    def on_iteration_end(self, worker: WorkerState, now: float,
                         workers: Sequence[WorkerState]) -> list[Assignment]:
        pool = self._pool_of(worker.id)
        return self.pools[pool].on_iteration_end(worker, now, self._pool_views(workers)[pool])

    def decode_worker(self, req: Request, workers: Sequence[WorkerState],
                      now: float) -> WorkerState | None:
        """Within the pool that prefilled it (its KV moves inside a pool's fabric)."""
        assert req.prefill_worker is not None
        pool = self._pool_of(req.prefill_worker)
        return self.pools[pool].decode_worker(req, self._pool_views(workers)[pool], now)

    def check_step(self, worker: WorkerState) -> int | None:
        return self.pools[self._pool_of(worker.id)].check_step(worker)

    @property
    def checking(self) -> bool:
        return any(pool.checking for pool in self.pools)

    def _pool_of(self, worker_id: int) -> int:
        size = len(self._members[0])
        guess = min(worker_id // size, len(self._members) - 1)
        while worker_id < self._members[guess].start:
            guess -= 1
        while worker_id >= self._members[guess].stop:
            guess += 1
        return guess

    def _pool_views(self, workers: Sequence[WorkerState]) -> list[list[WorkerState]]:
        """Each pool's workers, as one list per pool kept until the roster changes (each pool's
        policy keeps what it derives from its list while the list stands)."""
        if self._seen is not workers:
            self._views = [[workers[i] for i in members] for members in self._members]
            self._seen = workers
        return self._views

    def _front(self, req: Request, views: list[list[WorkerState]]) -> int:
        """The front router: the least loaded pool, unless a pool holds a longer run of the
        prompt's prefix at a load within one prompt per worker of it."""
        loads = [_load_per_worker(view) for view in views]
        least = min(range(len(views)), key=lambda i: (loads[i], i))
        runs = self._longest_runs(req, views)
        best = max(range(len(views)), key=lambda i: (runs[i], -loads[i], -i))
        if runs[best] > runs[least] and loads[best] - loads[least] <= req.prompt_len:
            return best
        return least

    def _longest_runs(self, req: Request, views: list[list[WorkerState]]) -> list[int]:
        """Per pool, the most of ``req``'s prefix blocks a live worker there holds from the
        first (the fleet's prefix directory, as a front router's KV indexer would say)."""
        runs = [0] * len(views)
        cache = views[0][0].kv.cache if views[0] else None
        if cache is None or cache.directory is None or not req.prefix:
            return runs
        for worker_id, run in cache.directory.runs(req).items():
            pool = self._pool_of(worker_id)
            if views[pool][worker_id - self._members[pool].start].alive:
                runs[pool] = max(runs[pool], run)
        return runs


def _load_per_worker(view: list[WorkerState]) -> float:
    live = [w for w in view if w.alive]
    return sum(w.unfinished_tokens for w in live) / len(live) if live else float("inf")

