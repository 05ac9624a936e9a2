"""Roles both ways: a prefill worker lends itself to the multiplexing side while prefill work is
light, and comes back when prompts queued for Path 1 are at risk.

A prefill worker that sits idle while another prefill worker does too becomes a multiplexing
worker: it decodes and takes Path 2 prompts. When Path 1 prompts are at risk and Path 2 cannot
save them, the lent worker that holds the least work drains (it takes no new decodes or
prompts) and, once its last request leaves, prefills again. Only lent workers return, so the
multiplexing side never shrinks below its configured size; a worker switches only when empty,
so no request changes hands, and keeps a role at least ``hold`` seconds (hysteresis).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tropical.sched.dispatch import fewest_unfinished
from tropical.sched.rules import BatchRules, Role
from tropical.sched.worker import WorkerState


@dataclass
class RoleSwitch:
    """The prefill workers lent to the multiplexing side, those draining to come back, and
    when each worker last switched."""

    hold: float = 5.0
    lent: set[int] = field(default_factory=set)
    returning: set[int] = field(default_factory=set)
    since: dict[int, float] = field(default_factory=dict)

    def update(self, workers: Sequence[WorkerState], now: float, pressed: bool,
               rules: dict[Role, BatchRules]) -> None:
        """Bring drained workers back, then lend an idle prefill worker or, when ``pressed``
        (Path 1 prompts at risk that Path 2 cannot take), start bringing one back."""
        for worker in workers:
            if worker.id in self.returning and worker.alive and _empty(worker, now):
                self._switch(worker, Role.PREFILL, rules, now)
                self.lent.discard(worker.id)
                self.returning.discard(worker.id)
        idle = [w for w in workers if w.alive and w.role is Role.PREFILL and _empty(w, now)
                and self._settled(w, now)]
        if not pressed and len(idle) >= 2:
            self._switch(idle[-1], Role.MULTIPLEX, rules, now)
            self.lent.add(idle[-1].id)
        elif pressed and not self.returning:
            back = fewest_unfinished(w for w in workers if w.id in self.lent and self._settled(w, now))
            if back is not None:
                self.returning.add(back.id)

    def _settled(self, worker: WorkerState, now: float) -> bool:
        return now - self.since.get(worker.id, -self.hold) >= self.hold

    def _switch(self, worker: WorkerState, role: Role, rules: dict[Role, BatchRules],
                now: float) -> None:
        worker.become(role, rules[role])
        self.since[worker.id] = now


def _empty(worker: WorkerState, now: float) -> bool:
    """Nothing queued, running or held on ``worker``: no KV, so nothing decodes, arrives or
    waits to migrate away."""
    return not worker.waiting and not worker.holds and worker.busy_until <= now
