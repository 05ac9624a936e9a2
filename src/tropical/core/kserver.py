"""Deadline scheduling on k ideal servers: the share of jobs an ideal cluster finishes in time.

Each job (arrival, work, deadline) runs on one server at a time, preemptively, the k earliest
deadlines first (a job may resume on another server: nothing is paid to move it); a job that can
no longer finish by its deadline, even with a server to itself from now on, yields to every other
(it misses either way, and it runs only in time nobody else wants, which changes no one's fate).
One server as fast as k together is the pooled bound's server, where one prompt may use every
worker at once; k servers at one worker's speed each is the k-server bound, the ideal for
policies that run each prompt on one worker. The gap between the two is what splitting one
prompt's prefill across workers could win. An ideal to measure policies against rather than a
proof: deadline order does not always meet the most deadlines.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

Job = tuple[float, float, float]
"""(arrival, work in seconds of one server at speed 1, deadline)."""


def deadline_attainment(jobs: Sequence[Job], speed: float, servers: int = 1, quantum: float = 0.0) -> float:
    """Share of ``jobs`` done by their deadline on ``servers`` servers doing ``speed`` seconds of
    work per second each, earliest deadline first, hopeless jobs yielding. Preemptive, or with
    ``quantum`` a job keeps its server for that many seconds each time it starts (math.inf: to
    its end), as a serving engine preempts a prompt only between its iterations, if at all."""
    if not jobs:
        raise ValueError("deadline attainment needs at least one job")
    if servers < 1:
        raise ValueError(f"deadline attainment needs at least one server, got {servers}")
    if quantum < 0:
        raise ValueError(f"deadline attainment needs a quantum of at least 0 s, got {quantum}")
    if speed <= 0:
        return 0.0
    order = sorted(jobs)
    left = [work for _, work, _ in order]
    queue: list[tuple[float, int]] = []
    held: list[tuple[float, int, float]] = []     # running, with when each may be preempted
    now, met, k = 0.0, 0, 0
    while k < len(order) or queue or held:
        if not queue and not held:
            now = max(now, order[k][0])
        while k < len(order) and order[k][0] <= now:
            heapq.heappush(queue, (order[k][2], k))
            k += 1
        running = [job for job in held if job[2] > now]
        for deadline, i, lock in held:
            if lock <= now:                             # its quantum is up: it competes again
                heapq.heappush(queue, (deadline, i))
        while queue and len(running) < servers:
            deadline, i = heapq.heappop(queue)
            if now + left[i] / speed <= deadline:      # else it yields: a miss either way
                running.append((deadline, i, now + quantum))
        if not running:
            held = []
            continue
        following = order[k][0] if k < len(order) else math.inf
        until = min(following, min(min(now + left[i] / speed, lock if lock > now else math.inf)
                                   for _, i, lock in running))   # an end, or a quantum up
        held = []
        for deadline, i, lock in running:
            if now + left[i] / speed <= until:
                met += 1
            else:
                left[i] -= (until - now) * speed
                held.append((deadline, i, lock))
        now = until
    return met / len(order)
