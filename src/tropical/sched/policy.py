"""The global-scheduler interface both substrates drive, and the decisions it returns.

A policy never touches a clock or a socket: the simulator and the router call it on arrivals
and iteration ends with the time and the workers' states, and apply the assignments it returns.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

from tropical.core.request import Request
from tropical.sched.assignment import Assignment
from tropical.sched.dispatch import decode_destination
from tropical.sched.rejection import Admission
from tropical.sched.rules import BatchRules, Role
from tropical.sched.worker import WorkerState


def apply(assignment: Assignment, workers: Sequence[WorkerState]) -> WorkerState:
    """Hand the request to its worker and record the decision; returns the worker to wake."""
    req, worker = assignment.request, workers[assignment.worker_id]
    if assignment.from_worker is not None:
        workers[assignment.from_worker].abort(req)
    req.path, req.reason, req.prefill_worker = assignment.path, assignment.reason, worker.id
    req.yielded = req.yielded or assignment.yields
    worker.enqueue(req)
    return worker


class Policy(ABC):
    """A global scheduling policy over a fixed set of worker roles."""

    name: str = "policy"
    admission: Admission = Admission()
    """Which requests to refuse before any work (``make_policy`` sets the run's stage)."""
    observes_iterations: bool = False
    """True if ``on_iteration_end`` may act; a substrate may skip the call (and the exact
    worker view it needs) for policies that never do."""
    routes_by_prefix: bool = False
    """True if the policy reads the fleet's prefix directory (which workers hold each prefix
    block) to choose workers. A cache-blind router keeps none, as a load-balancing router in
    front of vLLM keeps none: its workers still cache and reuse, and nothing pays to index them."""

    def keeps_directory(self, roles: Sequence[Role]) -> bool:
        """Is the fleet's prefix directory worth keeping on a fleet of ``roles``? Where the
        policy routes by prefix, by default."""
        return self.routes_by_prefix

    @abstractmethod
    def roles(self, num_workers: int) -> list[Role]:
        """The role of each worker for this policy on a cluster of ``num_workers``."""

    @abstractmethod
    def rules(self, role: Role) -> BatchRules:
        """Batch-formation rules for a worker of ``role``."""

    @property
    def learns_latency(self) -> bool:
        """Should each worker's predictor be corrected online from the iterations it runs?
        (Only policies that act on predictions care.)"""
        return False

    @abstractmethod
    def on_arrival(self, req: Request, now: float,
                   workers: Sequence[WorkerState]) -> list[Assignment]:
        """Decide (now or later) where a new request's prefill runs."""

    def on_iteration_end(self, worker: WorkerState, now: float,
                         workers: Sequence[WorkerState]) -> list[Assignment]:
        """Revisit held requests when a worker finishes an iteration; baselines hold none."""
        return []

    def check_step(self, worker: WorkerState) -> int | None:
        """The decode step of ``worker`` at which the policy wants to be asked again, if any
        (a substrate that skips iteration ends must stop there)."""
        return None

    def roster_changed(self) -> None:
        """A worker died, came back or changed roles (roles and liveness change only through the
        cluster, or the policy's own role switch): forget whatever was kept of who serves what."""
        return None

    @property
    def checking(self) -> bool:
        """Is ``check_step`` set for some worker now? (Runs already end at their next finish, so
        a substrate need not ask for each worker while it is not.)"""
        return False

    def rescue_floor(self, req: Request, now: float, workers: Sequence[WorkerState]) -> float:
        """A floor on the first token a later decision of this policy could still give ``req``,
        queued now on the path it chose (inf: it never moves a queued request). Early rejection
        asks it before refusing a request whose chosen path is predicted late."""
        return math.inf

    def decode_worker(self, req: Request, workers: Sequence[WorkerState],
                      now: float) -> WorkerState | None:
        """Where a request prefilled on a prefill worker decodes (None: no room yet, retry)."""
        return decode_destination(req, workers)
