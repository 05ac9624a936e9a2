"""Which prefill queues hold prompts at risk, looked at again only where something moved.

The toggle asks at every iteration end of every worker. Asking each prefill queue it queued
prompts on costs each event the fleet; yet a queue's answer (``QueueRisk``) reads only its
first prompts and its worker's next start, and those move only when the worker changes (it
marks itself: ``WorkerState.changed``) or when the clock passes that start (an idle worker
starts at the clock; a decode run booked lazily books itself when read past its end). So the
watch keeps every queue's answer and the ids of those at risk, in order, and looks again only
at the workers marked since its last look and those whose start the clock has reached. The
answers at risk are filed in heaps kept between looks (``RiskHeads``), from which a round reads
the prompts it takes without merging every queue's.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tropical.sched.risk import QueueRisk
from tropical.sched.risk_heads import KeptAtRisk, RiskHeads
from tropical.sched.worker import WorkerState


@dataclass(slots=True, eq=False)
class QueueWatch:
    """The prefill workers prompts were queued on (``queued_on``), those of them marked since
    the last look (``marked``, told by the workers themselves), each one's kept answer
    (``risks``), the ids of those with prompts at risk, ascending (``late``), and a heap of the
    starts the answers were priced from (``starts``; an entry is current while ``start_of``
    holds it); ``clock`` is the time of the last look (a look at an earlier time, as when
    a caller books an iteration ahead of the clock, looks at every queue again); ``heads``
    files the answers at risk for the rounds to read."""

    lookahead: int
    queued_on: set[int] = field(default_factory=set)
    marked: set[int] = field(default_factory=set)
    risks: dict[int, QueueRisk] = field(default_factory=dict)
    late: list[int] = field(default_factory=list)
    starts: list[tuple[float, int]] = field(default_factory=list)
    start_of: dict[int, float] = field(default_factory=dict)
    clock: float = -math.inf
    heads: RiskHeads = field(init=False)

    def __post_init__(self) -> None:
        self.heads = RiskHeads(self.risks)

    def follow(self, workers: Iterable[WorkerState]) -> None:
        """Have ``workers`` (a new roster's prefill workers) mark themselves here when they
        change, and look again at every queue: the roster itself moved."""
        for worker in workers:
            worker.tell(self.marked)
        self.marked |= self.queued_on

    def queued(self, worker_ids: Iterable[int]) -> None:
        """Prompts were queued on ``worker_ids``: their queues may now hold prompts at risk."""
        for worker_id in worker_ids:
            self.queued_on.add(worker_id)
            self.marked.add(worker_id)

    def at_risk(self, by_id: Mapping[int, WorkerState], now: float) -> KeptAtRisk[WorkerState]:
        """The at-risk prompts of the live prefill workers' queues (``by_id``) at ``now``, in
        the order of their ids; only prompts queued behind those in flight are asked."""
        if now < self.clock:
            self.marked |= self.queued_on
        self.clock = now
        while self.starts and self.starts[0][0] <= now:
            start, worker_id = heapq.heappop(self.starts)
            if self.start_of.get(worker_id) == start:
                del self.start_of[worker_id]
                self.marked.add(worker_id)
        stale = self.marked & self.queued_on
        self.marked.clear()
        for worker_id in stale:
            self._look(worker_id, by_id.get(worker_id), now)
        return KeptAtRisk(self.heads, self.late, by_id, now)

    def _look(self, worker_id: int, worker: WorkerState | None, now: float) -> None:
        """Price ``worker``'s queue again (its answer kept if its prices and start stand); one
        no longer a live prefill worker, or with nothing queued behind its batch, has none at
        risk (one with nothing queued at all is forgotten until a prompt is queued there)."""
        if worker is None or len(worker.waiting) <= worker.batch_prefills:
            self._settle(worker_id, False)
            if worker is not None and not worker.waiting:
                self.queued_on.discard(worker_id)
            return
        priced = worker.queued_costs(self.lookahead)
        start = max(now, worker.busy_until)
        risk = self.risks.get(worker_id)
        if risk is None or not risk.kept_for(priced, start):
            risk = self.risks[worker_id] = QueueRisk.of(priced, start)
        self._settle(worker_id, bool(risk.late))
        self.start_of[worker_id] = start
        heapq.heappush(self.starts, (start, worker_id))

    def _settle(self, worker_id: int, late: bool) -> None:
        """File ``worker_id`` among the queues at risk, or take it out."""
        self.heads.mark(worker_id, late)
        place = bisect_left(self.late, worker_id)
        filed = place < len(self.late) and self.late[place] == worker_id
        if late and not filed:
            insort(self.late, worker_id)
        elif filed and not late:
            del self.late[place]
