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
    _check(jobs, servers)
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


def bound_attainment(jobs: Sequence[Job], speed: float, servers: int, preemptive: bool = True,
                     soonest: bool = False, shares: Sequence[float] | None = None) -> float:
    """``deadline_attainment`` with every job bound at its arrival to the server with the least
    work left (its queue and the job it runs; lowest index breaks ties), as a router binds a
    prompt to one worker's queue, each server serving its own jobs earliest deadline first,
    hopeless ones yielding; ``preemptive``: an arrival with an earlier deadline takes its
    server from the job running there, else it waits for that job's end; ``soonest``: bound
    instead where it would start soonest, after only the work that goes ahead of it there (the
    job running, unless it preempts it, and the queued jobs with earlier deadlines), as
    ``tropical+``'s Path 1 places a prompt by laxity (``sched.placement``); ``shares``: each
    server's speed as a share of ``speed`` (1 each by default), as a multiplexing worker's
    TPOT-sized chunks prefill slower than a prefill worker's batches. Least work and soonest
    are then measured in time: work left over speed, and the start plus the job's own time."""
    _check(jobs, servers)
    scale = [1.0] * servers if shares is None else list(shares)
    if len(scale) != servers or min(scale) <= 0:
        raise ValueError(f"bound attainment needs one positive speed share per server "
                         f"({servers}), got {scale}")
    if speed <= 0:
        return 0.0
    order = sorted(jobs)
    left = [work for _, work, _ in order]
    fleet = [_BoundServer(left, speed * share) for share in scale]
    for i, (arrival, work, deadline) in enumerate(order):
        for server in fleet:
            server.advance(arrival)
        if soonest:
            chosen = min(range(servers), key=lambda s: (fleet[s].start_of(deadline, i, preemptive)
                                                        + work / fleet[s].speed, s))
        else:
            chosen = min(range(servers), key=lambda s: fleet[s].work / fleet[s].speed)
        fleet[chosen].take(deadline, i, work, preemptive)
    for server in fleet:
        server.advance(math.inf)
    return sum(server.met for server in fleet) / len(order)


def _check(jobs: Sequence[Job], servers: int) -> None:
    """Refuse what no schedule can be measured on, naming it."""
    if not jobs:
        raise ValueError("deadline attainment needs at least one job")
    if servers < 1:
        raise ValueError(f"deadline attainment needs at least one server, got {servers}")


class _BoundServer:
    """One server of ``bound_attainment``: its queue by deadline, the job it runs, its clock,
    the work its jobs have left and how many it finished in time. ``left`` is shared by all
    servers, by job (a plain class: compiled)."""

    __slots__ = ("left", "speed", "queue", "running", "now", "work", "met")

    def __init__(self, left: list[float], speed: float) -> None:
        self.left, self.speed = left, speed
        self.queue: list[tuple[float, int]] = []
        self.running: tuple[float, int] | None = None
        self.now, self.work, self.met = 0.0, 0.0, 0

    def take(self, deadline: float, i: int, work: float, preemptive: bool) -> None:
        """Queue job ``i``, which arrives now; preemptive, the job running goes back to the queue
        if its deadline is later. The next job starts when the clock moves on (``advance``), so
        that jobs arriving at the same instant are ordered by deadline first."""
        self.work += work
        heapq.heappush(self.queue, (deadline, i))
        if preemptive and self.running is not None and (deadline, i) < self.running:
            heapq.heappush(self.queue, self.running)
            self.running = None

    def start_of(self, deadline: float, i: int, preemptive: bool) -> float:
        """When job ``i`` arriving now would start here: after the job running (unless it
        preempts it) and the queued jobs with earlier deadlines."""
        ahead = sum(self.left[j] for d, j in self.queue if (d, j) < (deadline, i))
        running = self.running
        if running is not None and not (preemptive and (deadline, i) < running):
            ahead += self.left[running[1]]
        return self.now + ahead / self.speed

    def advance(self, until: float) -> None:
        """Run the queue up to ``until`` (a job ending then leaves its server to whatever
        arrives then too: the next is chosen with it)."""
        while self.running is not None or (self.now < until and self._next()):
            assert self.running is not None
            i = self.running[1]
            end = self.now + self.left[i] / self.speed
            if end > until:
                done = (until - self.now) * self.speed
                self.left[i] -= done
                self.work -= done
                break
            self.work -= self.left[i]
            self.now, self.running = end, None
            self.met += 1
        if until < math.inf:
            self.now = until

    def _next(self) -> bool:
        """Start the earliest deadline that can still be met (the others yield: dropped)."""
        while self.queue:
            deadline, i = heapq.heappop(self.queue)
            if self.now + self.left[i] / self.speed <= deadline:
                self.running = (deadline, i)
                return True
            self.work -= self.left[i]
        return False
