"""When a prefill worker could take more work: the toggle's view of Path 1."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tropical.core.latency.iterations import prefill_time
from tropical.core.latency.model import LatencyModel
from tropical.core.request import Request
from tropical.sched.dispatch import NewTokenFloors
from tropical.sched.worker import WorkerState


def free_at(worker: WorkerState, now: float) -> float:
    """When ``worker`` could start a new prefill: after its iteration and its local queue."""
    return max(now, worker.busy_until) + worker.queued_work


def prompt_floors(req: Request, prefill: list[WorkerState]) -> Callable[[WorkerState], float]:
    """For each prefill worker, a floor on how long ``req``'s prompt takes there: priced with
    the fewest new tokens its prefix cache could leave (the fleet's directory says; a prompt
    costs more the more of it is new), once per count of new tokens and latency model, so that
    Path 1 prices in full only the workers that could win."""
    floors = NewTokenFloors.of(req, prefill)
    priced: dict[tuple[int, int], float] = {}

    def floor(worker: WorkerState) -> float:
        key = (floors.at(worker), id(worker.latency))
        seconds = priced.get(key)
        if seconds is None:
            seconds = priced[key] = prefill_time(worker.latency, key[0], req.prompt_len - key[0])
        return seconds
    return floor


def prompt_floor_vector(req: Request, prefill: list[WorkerState], size: int,
                        latency: LatencyModel) -> np.ndarray:
    """``prompt_floors`` of every worker of a fleet of ``size`` whose prefill workers share
    ``latency``, by id, in vector form (``NewTokenFloors.vector``: priced once per level)."""
    prompt = req.prompt_len
    return NewTokenFloors.of(req, prefill).vector(
        size, lambda tokens: prefill_time(latency, tokens, prompt - tokens))
