"""Many simulations at once: capacity searches and plain runs, spread over processes.

Each simulation reports to a shared queue when it ends, so one progress bar counts every
simulated run across the worker processes.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queues
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from tqdm import tqdm

from tropical.core.capacity import CapacityResult, find_capacity
from tropical.core.metrics import Summary
from tropical.sim.run import Experiment, SimResult, simulate

K = TypeVar("K", bound=Hashable)
_progress: Any = None


@dataclass(frozen=True, slots=True)
class PolicyCapacity:
    """A policy's capacity as a rate scale and in requests per second, under the paper's
    attainment (``result``) and under stream attainment (``stream``)."""

    policy: str
    result: CapacityResult
    base_rate: float
    wall_s: float = 0.0
    stream: CapacityResult | None = None

    @property
    def capacity_rps(self) -> float:
        return self.result.rate_scale * self.base_rate

    @property
    def stream_capacity_rps(self) -> float:
        return self.stream.rate_scale * self.base_rate if self.stream is not None else float("nan")


def _tick(label: str) -> None:
    if _progress is not None:
        _progress.put(label)


def capacity(exp: Experiment, target: float = 0.9, rel_tol: float = 0.02) -> PolicyCapacity:
    """Highest rate scales of ``exp`` at which at least ``target`` of requests attain, and
    stream-attain. Stream attainment never exceeds attainment, so its search runs down from the
    first capacity (never above it: attainment need not fall monotonically with rate) and
    reuses every run already simulated."""
    runs: dict[float, Summary] = {}

    def summary(scale: float) -> Summary:
        if scale not in runs:
            runs[scale] = simulate(exp.at_rate(scale), stop_below=target).summary
            _tick(exp.policy)
        return runs[scale]

    started = time.perf_counter()
    result = find_capacity(lambda s: summary(s).attainment, target=target, rel_tol=rel_tol,
                           start=exp.rate_scale)
    top = result.rate_scale or exp.rate_scale
    stream = find_capacity(lambda s: summary(s).stream_attainment, target=target, rel_tol=rel_tol,
                           start=top, max_scale=top)
    return PolicyCapacity(exp.policy, result, exp.trace.mean_rate, time.perf_counter() - started,
                          stream)


def simulate_and_tick(exp: Experiment, stop_below: float | None = None) -> SimResult:
    result = simulate(exp, stop_below)
    _tick(exp.policy)
    return result


def _init_worker(progress: Any) -> None:
    global _progress
    _progress = progress


def run_all(fn: Callable[..., Any], jobs: Mapping[K, tuple], processes: int = 2,
            progress: str | None = "simulations") -> dict[K, Any]:
    """``fn(*args)`` for every job, ``processes`` at a time; a bar counts simulated runs."""
    manager = mp.Manager()
    ticks = manager.Queue()
    with ProcessPoolExecutor(max_workers=max(1, processes), initializer=_init_worker,
                             initargs=(ticks,)) as pool:
        futures = {key: pool.submit(fn, *args) for key, args in jobs.items()}
        with tqdm(desc=progress, unit="sim", disable=progress is None) as bar:
            while not all(f.done() for f in futures.values()) or not ticks.empty():
                _drain(ticks, bar)
        results = {key: f.result() for key, f in futures.items()}
    manager.shutdown()
    return results


def capacities(jobs: Mapping[K, Experiment], target: float = 0.9, rel_tol: float = 0.02,
               processes: int = 2, progress: str | None = "capacity search") -> dict[K, PolicyCapacity]:
    """Capacity of every experiment in ``jobs``."""
    return run_all(capacity, {k: (e, target, rel_tol) for k, e in jobs.items()}, processes, progress)


def simulations(jobs: Mapping[K, Experiment], processes: int = 2,
                progress: str | None = "simulations",
                stop_below: float | None = None) -> dict[K, SimResult]:
    """One run of every experiment in ``jobs`` (see ``simulate`` for ``stop_below``)."""
    return run_all(simulate_and_tick, {k: (e, stop_below) for k, e in jobs.items()}, processes, progress)


def sweep(exp: Experiment, policies: Sequence[str], target: float = 0.9, rel_tol: float = 0.02,
          jobs: int = 2, show_progress: bool = True) -> dict[str, PolicyCapacity]:
    """Capacity of each policy on the same experiment."""
    return capacities({p: exp.with_policy(p) for p in policies}, target, rel_tol, jobs,
                      "capacity search" if show_progress else None)


def _drain(ticks: Any, bar: tqdm) -> None:
    try:
        label = ticks.get(timeout=0.2)
    except queues.Empty:
        return
    bar.set_postfix_str(label)
    bar.update()
