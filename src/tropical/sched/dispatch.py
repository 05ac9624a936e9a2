"""Load-balancing choices shared by every policy (InFaaS-style: fewest unfinished tokens).

Each choice walks the live workers from the least loaded up (or the lowest bound on their cost)
and stops as soon as no worker further on could win, so that a dispatch over a thousand workers
prices the few at the front. Over the fleet a cluster runs, the walk reads the fleet's
``LoadIndex`` (each worker's terms kept across decisions: the fleet's bounds are a few vector
operations, and the walk reads exact costs only of the workers it reaches); over any other set
of workers it builds a heap from lower bounds of each worker's load (``load_floor``: one pass of
cheap reads), or, for the least work, none when the worker of least bound costs its bound. Both
read no decode progress the simulator has not booked yet (``sched.lag``): only the workers the
walk reaches are brought up to date.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final

import numpy as np

from tropical.core.request import Request
from tropical.sched.load_index import Ranked, fleet_index
from tropical.sched.prefix_directory import PrefixDirectory
from tropical.sched.rules import Role, decodes, takes_arrivals
from tropical.sched.worker import WorkerState

ARRIVAL_ROLES: Final = tuple(role for role in Role if takes_arrivals(role))
DECODING_ROLES: Final = tuple(role for role in Role if decodes(role))
Bounded = tuple[float, int, WorkerState]
"""A worker with a lower bound on what a choice would cost there, and its id to break ties."""


def by_load(workers: Sequence[WorkerState], roles: Sequence[Role],
            among: Sequence[WorkerState] | None = None) -> Iterator[WorkerState]:
    """The live workers of ``roles`` by fewest unfinished tokens (lowest id breaks ties),
    produced lazily: from the fleet's index if ``workers`` is an indexed fleet. ``among``: the
    live workers of ``roles``, where the caller keeps them (a pass over the fleet saved)."""
    index = fleet_index(workers)
    if index is None:
        return least_loaded_first(_of_roles(workers, roles) if among is None else among)
    return _exact(index.ordered(roles), workers)


def _of_roles(workers: Sequence[WorkerState], roles: Sequence[Role]) -> Iterator[WorkerState]:
    """The workers of ``roles`` (a generator function: compiled, a generator expression kept in
    a variable is a list, built whole)."""
    for worker in workers:
        if worker.role in roles:
            yield worker


def first_live(workers: Sequence[WorkerState], roles: Sequence[Role],
               test: Callable[[WorkerState], bool] | None = None) -> WorkerState | None:
    """The first live worker of ``roles`` (that passes ``test``), or None. Asked of the fleet's
    index if ``workers`` is an indexed fleet."""
    index = fleet_index(workers)
    if index is None:
        for worker in workers:
            if worker.alive and worker.role in roles and (test is None or test(worker)):
                return worker
        return None
    for wid in index.live_ids(roles):
        worker = workers[int(wid)]
        if test is None or test(worker):
            return worker
    return None


def with_workers(ranked: Iterable[Ranked], workers: Sequence[WorkerState]) -> Iterator[Bounded]:
    """(bound, id, worker) for each (bound, id) of ``ranked``, lazily (a generator function: a
    generator expression, compiled, would be built whole)."""
    for bound, wid in ranked:
        yield bound, wid, workers[wid]


def _exact(filed: Iterator[Ranked], workers: Sequence[WorkerState]) -> Iterator[WorkerState]:
    """Workers in order of exact load, from ``filed`` in order of keys that never exceed it: a
    worker goes out once no key still to come could be below its load."""
    heap: list[tuple[int, int, WorkerState]] = []
    upcoming = next(filed, None)
    while heap or upcoming is not None:
        if upcoming is not None and (not heap or upcoming < (heap[0][0], heap[0][1])):
            worker = workers[upcoming[1]]
            heapq.heappush(heap, (worker.unfinished_tokens, upcoming[1], worker))
            upcoming = next(filed, None)
        else:
            yield heapq.heappop(heap)[2]


def least_loaded_first(workers: Iterable[WorkerState]) -> Iterator[WorkerState]:
    """The live workers by fewest unfinished tokens (lowest id breaks ties), produced lazily: a
    worker whose floor reaches the front goes back in at its exact load unless that is its floor."""
    heap = [(w.load_floor, w.id, w) for w in workers if w.alive]
    heapq.heapify(heap)
    while heap:
        floor, wid, worker = heap[0]
        exact = worker.unfinished_tokens
        if exact == floor:
            heapq.heappop(heap)
            yield worker
        else:
            heapq.heapreplace(heap, (exact, wid, worker))


def fewest_unfinished(workers: Iterable[WorkerState]) -> WorkerState | None:
    """The live worker with the least outstanding work (lowest id breaks ties)."""
    return next(least_loaded_first(workers), None)


def least_loaded_of(workers: Sequence[WorkerState], roles: Sequence[Role]) -> WorkerState | None:
    """``fewest_unfinished`` among the live workers of ``roles``, read from the fleet's index."""
    return next(by_load(workers, roles), None)


def least_work(req: Request, workers: Sequence[WorkerState], roles: Sequence[Role],
               among: Sequence[WorkerState] | None = None) -> WorkerState | None:
    """The live worker of ``roles`` with the least outstanding work once it took ``req``: its
    unfinished tokens plus the prompt tokens of ``req`` its prefix cache lacks (lowest id breaks
    ties; without a cache, the same choice as ``fewest_unfinished``). ``among`` as ``by_load``'s."""
    floors = NewTokenFloors.of(req, workers)
    index = fleet_index(workers)

    def cost(worker: WorkerState) -> float:
        return worker.unfinished_tokens + worker.prompt_split(req)[0]

    if index is None:
        live = [w for w in (_of_roles(workers, roles) if among is None else among) if w.alive]
        bounds = [w.load_floor + floors.at(w) for w in live]
        best = exact_lead(live, bounds, cost)
        if best is None:
            bounded = [(b, w.id, w) for b, w in zip(bounds, live, strict=True)]
            best = cheapest_of(least_bound_first(bounded), cost)
    else:
        best = cheapest_of(with_workers(index.ordered(roles, floors.vector(len(workers))), workers), cost)
    return None if best is None else best[0]


def exact_lead(live: list[WorkerState], bounds: list[int],
               cost: Callable[[WorkerState], float]) -> tuple[WorkerState, float] | None:
    """The worker of ``live`` with the least bound (lowest id breaks ties) and its cost, if its
    cost is its bound: then no other can cost less (each costs at least its bound), so the
    choice needs no heap; None otherwise. Load bounds are exact for most workers: a choice over
    hundreds of them mostly ends here (one pass, no tuple per worker)."""
    lead = -1
    for i in range(len(live)):
        below = lead < 0 or bounds[i] < bounds[lead]
        if below or (bounds[i] == bounds[lead] and live[i].id < live[lead].id):
            lead = i
    if lead < 0:
        return None
    price = cost(live[lead])
    return (live[lead], price) if price == bounds[lead] else None


def cheapest(workers: Iterable[WorkerState], bound: Callable[[WorkerState], float],
             cost: Callable[[WorkerState], float]) -> tuple[WorkerState, float] | None:
    """The live worker of least ``cost`` (lowest id breaks ties) and that cost, priced in order of
    ``bound``, which is never above ``cost``: the walk stops once no worker further on could win."""
    return cheapest_of(least_bound_first((bound(w), w.id, w) for w in workers if w.alive), cost)


def least_bound_first(bounded: Iterable[Bounded]) -> Iterator[Bounded]:
    """``bounded`` least bound first, produced lazily from a heap (one pass, then a logarithm
    a step)."""
    heap = list(bounded)
    heapq.heapify(heap)
    while heap:
        yield heapq.heappop(heap)


def cheapest_of(bounds: Iterable[Bounded],
                cost: Callable[[WorkerState], float]) -> tuple[WorkerState, float] | None:
    """The worker of least ``cost`` (lowest id breaks ties) and that cost, from workers given in
    order of a bound never above their cost: the walk stops once no worker further on could win."""
    first = next(by_cost(bounds, cost), None)
    return None if first is None else (first[2], first[0])


def by_cost(bounds: Iterable[Bounded], cost: Callable[[WorkerState], float]) -> Iterator[Bounded]:
    """(cost, id, worker) by least ``cost`` (lowest id breaks ties), lazily, from workers given
    in order of a bound never above their cost: a worker is priced only once its bound comes
    below the least price found and not yet yielded, so the walk prices only those that could
    come next."""
    heap: list[Bounded] = []
    ahead = iter(bounds)
    upcoming = next(ahead, None)
    while heap or upcoming is not None:
        if upcoming is not None and (not heap or (upcoming[0], upcoming[1]) < (heap[0][0], heap[0][1])):
            heapq.heappush(heap, (cost(upcoming[2]), upcoming[1], upcoming[2]))
            upcoming = next(ahead, None)
        else:
            yield heapq.heappop(heap)


class NewTokenFloors:
    """For each worker, a floor on the prompt tokens of ``req`` it would compute: what the
    request has left where it is, else its prompt past the run of its prefix blocks that the
    worker holds (the fleet's directory says, in one walk of the prompt's blocks: ``levels``,
    the workers nested by how many blocks they hold, read deepest first), and never less than
    the last token (a hit stops short of it). Every worker that holds none of its blocks has the
    same floor (``rest``). (A plain class: compiled.)"""

    __slots__ = ("left", "prompt", "span", "levels", "rest", "directory")

    def __init__(self, left: int, prompt: int, span: int, levels: list[tuple[int, set[int]]],
                 rest: int, directory: PrefixDirectory | None = None) -> None:
        self.left, self.prompt, self.span, self.levels, self.rest = left, prompt, span, levels, rest
        self.directory = directory

    @classmethod
    def of(cls, req: Request, workers: Sequence[WorkerState]) -> NewTokenFloors:
        left = req.remaining_prompt
        if not req.prefix:
            return cls(left, req.prompt_len, 1, [], left)
        cache = next((w.kv.cache for w in workers if w.kv.cache is not None), None)
        if cache is None or cache.directory is None:
            return cls(left, req.prompt_len, 1, [], min(left, 1))
        if cache.host is not None and cache.host.shared:
            levels, everyone = cache.directory.levels_with(req, cache.host)
            floors = cls(left, req.prompt_len, req.prefix_block, levels, 0, cache.directory)
            floors.rest = floors.floor(everyone)
            return floors
        return cls(left, req.prompt_len, req.prefix_block, cache.directory.levels(req),
                   min(left, max(1, req.prompt_len)), cache.directory)

    def at(self, worker: WorkerState) -> int:
        for depth, held in reversed(self.levels):
            if worker.id in held:
                return self.floor(depth)
        return self.rest

    def floor(self, depth: int) -> int:
        """The floor of a worker holding ``depth`` of the prompt's blocks."""
        return min(self.left, max(1, self.prompt - depth * self.span))

    def vector(self, size: int, price: Callable[[int], float] | None = None) -> np.ndarray:
        """``at`` of every worker of a fleet of ``size``, by id (priced by ``price`` if given:
        once per level), filled a level at a time (no look at each worker in Python: the first
        blocks of a conversation are held by every worker, and a level of every worker is
        filled without reading its set: at 1,024 workers that read took 12 µs; the directory
        keeps the ids of the other large levels, ``PrefixDirectory.ids``)."""
        value: Callable[[int], float] = int if price is None else price
        floors = np.empty(size, np.int64 if price is None else float)
        floors.fill(value(self.rest))     # np.full is a Python wrapper around these two
        directory = self.directory
        for depth, held in self.levels:
            if len(held) == size:
                floors.fill(value(self.floor(depth)))
            else:
                assert directory is not None, "a prompt's levels come from the fleet's directory"
                floors[directory.ids(held)] = value(self.floor(depth))
        return floors


def first_fitting(ordered: Iterable[WorkerState],
                  fits: Callable[[WorkerState], bool]) -> WorkerState | None:
    """The first worker of ``ordered`` (least loaded first: ``by_load``) that ``fits``."""
    return next((worker for worker in ordered if fits(worker)), None)


def has_room(req: Request, worker: WorkerState) -> bool:
    """Could ``worker`` decode ``req`` now: it decodes, holds its KV, and has a seat."""
    return decodes(worker.role) and worker.can_hold(req) and worker.batch_size < worker.rules.max_seqs


def decode_destination(req: Request, workers: Sequence[WorkerState]) -> WorkerState | None:
    """Where a prefilled request should decode: fewest unfinished tokens among those with room
    (only decoding workers enter the walk: under disaggregation the least loaded are often the
    prefill workers, and the walk would pass each of them)."""
    return first_fitting(by_load(workers, DECODING_ROLES), lambda w: has_room(req, w))
