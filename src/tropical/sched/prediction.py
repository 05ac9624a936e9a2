"""When a prefill worker could take more work: the toggle's view of Path 1."""

from __future__ import annotations

from tropical.sched.worker import WorkerState


def free_at(worker: WorkerState, now: float) -> float:
    """When ``worker`` could start a new prefill: after its iteration and its local queue."""
    return max(now, worker.busy_until) + worker.queued_work
