"""Goodput capacity per policy: bisection over the trace's rate scale, policies in parallel."""

from __future__ import annotations

import multiprocessing as mp
import queue as queues
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from tqdm import tqdm

from tropical.core.capacity import CapacityResult, find_capacity
from tropical.sim.run import Experiment, simulate

_progress: mp.Queue | None = None


@dataclass(frozen=True, slots=True)
class PolicyCapacity:
    """A policy's capacity as a rate scale and in requests per second."""

    policy: str
    result: CapacityResult
    base_rate: float

    @property
    def capacity_rps(self) -> float:
        return self.result.rate_scale * self.base_rate


def capacity(exp: Experiment, target: float = 0.9, rel_tol: float = 0.02) -> PolicyCapacity:
    """Highest rate scale of ``exp`` at which at least ``target`` of requests attain."""

    def attainment(scale: float) -> float:
        value = simulate(exp.at_rate(scale), stop_below=target).summary.attainment
        if _progress is not None:
            _progress.put(exp.policy)
        return value

    result = find_capacity(attainment, target=target, rel_tol=rel_tol, start=exp.rate_scale)
    return PolicyCapacity(exp.policy, result, exp.trace.mean_rate)


def _init_worker(queue: mp.Queue) -> None:
    global _progress
    _progress = queue


def sweep(exp: Experiment, policies: Sequence[str], target: float = 0.9, rel_tol: float = 0.02,
          jobs: int = 2, show_progress: bool = True) -> dict[str, PolicyCapacity]:
    """Capacity of each policy on the same experiment, ``jobs`` policies at a time."""
    queue: mp.Queue = mp.Manager().Queue()
    with ProcessPoolExecutor(max_workers=max(1, jobs), initializer=_init_worker,
                             initargs=(queue,)) as pool:
        futures = {p: pool.submit(capacity, exp.with_policy(p), target, rel_tol) for p in policies}
        with tqdm(desc="capacity search", unit="sim", disable=not show_progress) as bar:
            while not all(f.done() for f in futures.values()) or not queue.empty():
                _drain(queue, bar)
        return {p: f.result() for p, f in futures.items()}


def _drain(queue: mp.Queue, bar: tqdm) -> None:
    try:
        policy = queue.get(timeout=0.2)
    except queues.Empty:
        return
    bar.set_postfix_str(policy)
    bar.update()
