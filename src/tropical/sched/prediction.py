"""When a prefill worker could take more work: the toggle's view of Path 1."""

from __future__ import annotations

from tropical.core.latency.model import prefill_time
from tropical.sched.worker import WorkerState


def free_at(worker: WorkerState, now: float) -> float:
    """When ``worker`` could start a new prefill: after its iteration and its local queue."""
    start = max(now, worker.busy_until)
    return start + sum(prefill_time(worker.latency, r.remaining_prompt, r.computed)
                       for r in worker.queued())
