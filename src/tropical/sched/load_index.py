"""The fleet's live workers in order of a lower bound on what a choice would cost there.

A dispatch over a thousand workers cannot afford a pass of Python over every worker per
decision. The index keeps, per worker, the terms its bounds are made of (its load as booked and,
while a substrate books decode runs lazily, its batch, the iterations to its next finish and the
least an iteration takes; when its iteration ends; its queued prefill work and prompt tokens; its
decode contexts; its role) in arrays,
so that the bounds of the whole fleet at a decision's clock are a few vector operations; the walk
then reads the exact cost of only the workers it reaches (``dispatch.cheapest_of``). Terms change
only when a worker does: a worker marks itself (``WorkerState.changed``) and the index copies the
marked ones before its next walk.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, cast

import numpy as np

from tropical.sched.rules import Role
from tropical.sched.worker import WorkerState

Ranked = tuple[float | int, int]
"""A live worker's bound and id (a load floor is a whole number of tokens, a time is not)."""
ROLES = tuple(Role)
_ASKED = 12
"""Workers behind their booking that ``_take_floors`` asks one by one rather than in vector form."""
FIRST = 32
"""Workers a walk sorts at first, with any that tie the last of them: most walks stop within
them (the rest are sorted if not; ids ascend, so a stable sort breaks ties by id)."""


def _column(size: int, kind: type = np.int64) -> np.ndarray:
    return np.zeros(size, kind)


@dataclass(slots=True, eq=False)
class LoadIndex:
    """The fleet (``workers``, by id), the workers marked since the last walk, and per worker
    its walk key as booked (its load as booked × fleet size + its id, which no two workers
    share: ``booked_keys``), its lazily booked batch (0: none), the iterations to its next
    finish, when its iteration ends and, with a batch booked lazily, when that iteration ends
    (``lazy_until``; inf without), the least an iteration takes, its queued prefill work, the
    prompt tokens queued there, its decode contexts as booked, its KV block size, its role (an
    index into ``ROLES``), whether it is live, and its walk key at ``floors_at`` (its load floor
    then in place of its booked load: ``keys``; None: not taken since the clock moved); the live
    workers of each set of roles walked (``members``); memory views of the columns, through
    which re-filing writes (``views``); and each worker's role and liveness as filed
    (``filed_roles``, ``filed_alive``: compared as objects, the columns are not read back)."""

    workers: Sequence[WorkerState]
    booked_keys: np.ndarray
    batch: np.ndarray
    to_finish: np.ndarray
    busy_until: np.ndarray
    lazy_until: np.ndarray
    pace: np.ndarray
    queued_work: np.ndarray
    waiting_prompt: np.ndarray
    decode_context: np.ndarray
    block_size: np.ndarray
    role: np.ndarray
    live: np.ndarray
    keys: np.ndarray
    floors_at: float | None = None
    marked: set[int] = field(default_factory=set)
    members: dict[tuple[Role, ...], np.ndarray] = field(default_factory=dict)
    views: list[Any] = field(default_factory=list)
    filed_roles: list[Role | None] = field(default_factory=list)
    filed_alive: list[bool] = field(default_factory=list)

    @classmethod
    def over(cls, workers: Sequence[WorkerState]) -> LoadIndex:
        """An index of ``workers`` (the fleet, by id), each of which reports its changes to it."""
        n = len(workers)
        index = cls(workers, booked_keys=_column(n), batch=_column(n), to_finish=_column(n),
                    busy_until=_column(n, float), lazy_until=np.full(n, math.inf),
                    pace=_column(n, float), queued_work=_column(n, float), waiting_prompt=_column(n),
                    decode_context=_column(n), block_size=_column(n), role=_column(n, np.int8),
                    live=_column(n, bool), keys=_column(n))
        index.views = index._column_views()
        index.filed_roles, index.filed_alive = [None] * n, [False] * n
        for worker in workers:
            index.watch(worker)
        return index

    def watch(self, worker: WorkerState) -> None:
        """File ``worker`` (new, or a fresh state in its slot of the fleet) at the next walk, and
        again whenever it changes; walks over the fleet find this index through its workers."""
        worker.index = self
        worker.tell(self.marked)
        self.marked.add(worker.id)
        self.block_size[worker.id] = worker.kv.block_size

    def of(self, workers: Sequence[WorkerState]) -> bool:
        """Does this index order ``workers`` (the fleet itself, not a part of it)?"""
        return workers is self.workers

    def ordered(self, roles: Sequence[Role], extra: np.ndarray | None = None) -> Iterator[Ranked]:
        """The live workers of ``roles`` as (load floor, id), least first (lowest id breaks
        ties), the floors taken at the substrate's clock now; with ``extra`` (one whole number
        per worker id), as (load floor + its term, id): added to the walk keys."""
        ids = self.live_ids(roles)
        keys = self._floor_keys()[ids]
        if extra is not None:
            keys += extra[ids] * len(self.workers)
        return _by_key(keys, len(self.workers))

    def live_ids(self, roles: Sequence[Role]) -> np.ndarray:
        """The ids of the live workers of ``roles``, ascending (brought up to date first)."""
        self.refile()
        key = tuple(roles)
        ids = self.members.get(key)
        if ids is None:
            mask = self.live & np.logical_or.reduce([self.role == ROLES.index(r) for r in key])
            ids = self.members[key] = np.flatnonzero(mask)
        return ids

    def load_floors(self, ids: np.ndarray) -> np.ndarray:
        """``WorkerState.load_floor`` of each worker of ``ids``, read from their walk keys."""
        self.refile()
        return self._floor_keys()[ids] // len(self.workers)

    def _floor_keys(self) -> np.ndarray:
        """Every worker's walk key with its load floor at the substrate's clock now, taken once
        per clock; where no substrate books lazily, the booked loads are the floors."""
        lag = self.workers[0].lag
        if lag is None:
            return self.booked_keys
        if self.floors_at != lag.now:
            self._take_floors(lag.now)
        return self.keys

    def _take_floors(self, now: float) -> None:
        """Every worker's ``load_floor`` at ``now``: the booked load, less the lazily booked
        decode iterations elapsed by now, worked out only for the workers whose iteration has
        ended with a batch booked (none of a prefill pool; each is in a decode run, so its
        ``pace`` is positive: ``WorkerState.booked_load``). A few such workers are asked their
        own ``load_floor`` (their terms are filed as they stand, so it agrees): under a burst at
        1,024 workers there are about ten at a clock (9.7 on average, counted over a run), and
        each vector operation on so few rows costs half a microsecond whatever their number.
        Kept for the clock: a worker re-filed at the same clock has its row written from its own
        ``load_floor``, so that a decision's second walk (a migration's decode target, then the
        round's shortlist) takes none."""
        np.copyto(self.keys, self.booked_keys)
        self.floors_at = now
        n = len(self.workers)
        behind = (self.lazy_until <= now).nonzero()[0]
        if len(behind) <= _ASKED:
            *_, keys = self.views
            for worker_id in behind.tolist():
                keys[worker_id] = self.workers[worker_id].load_floor * n + worker_id
            return
        most = np.minimum(self.to_finish[behind], 2 + ((now - self.busy_until[behind])
                                                       / self.pace[behind]).astype(np.int64))
        most *= self.batch[behind]
        most *= n
        self.keys[behind] -= most

    def free_at(self, ids: np.ndarray, now: float) -> np.ndarray:
        """``prediction.free_at`` of each worker of ``ids`` at ``now``."""
        return np.maximum(now, self.busy_until[ids]) + self.queued_work[ids]

    def refile(self) -> None:
        """Copy each marked worker's terms into its row, through memory views of the columns (a
        view's item is a plain number: a numpy scalar read or write costs several times more,
        and a thousand-worker fleet re-files dozens of workers per decision). Rows are indexed
        by the ids as the set holds them (compiled, an int id past 256 is boxed anew at each
        write), roles and liveness are compared as filed rather than read back, and block sizes
        are filed once, by ``watch``: in a 1,024-worker ``chunked-512`` run (8,000 requests)
        re-filing fell from 3,223 M to 1,729 M instructions (callgrind)."""
        if not self.marked:
            return
        booked_keys, batch, to_finish, busy_until, lazy_until, pace, queued_work, waiting_prompt, \
            decode_context, keys = self.views
        n = len(self.workers)
        lag = self.workers[0].lag
        if lag is None or self.floors_at != lag.now:
            self.floors_at = None
        for row in cast(set[object], self.marked):
            worker = self.workers[cast(int, row)]
            load, batched, steps = worker.booked_load()
            booked_keys[row] = load * n + worker.id
            batch[row], to_finish[row] = batched, steps
            until = worker.booked_busy_until()
            busy_until[row], lazy_until[row] = until, until if batched else math.inf
            pace[row] = worker.pace
            if self.floors_at is not None:
                keys[row] = worker.load_floor * n + worker.id
            queued_work[row], waiting_prompt[row] = worker.queued_work, worker.waiting_prompt
            decode_context[row] = worker.decode_context_floor
            if worker.role is not self.filed_roles[worker.id] or worker.alive != self.filed_alive[worker.id]:
                self._file_membership(worker)
        self.marked.clear()

    def _file_membership(self, worker: WorkerState) -> None:
        """``worker``'s new role or liveness into its row; the sets of members walked lapse."""
        self.filed_roles[worker.id], self.filed_alive[worker.id] = worker.role, worker.alive
        self.role[worker.id], self.live[worker.id] = ROLES.index(worker.role), worker.alive
        self.members.clear()

    def _column_views(self) -> list[Any]:
        """Writable memory views of the columns, in ``refile``'s order (typed loosely: a view
        of a float column takes floats)."""
        return [memoryview(cast(Any, column)) for column in (
            self.booked_keys, self.batch, self.to_finish, self.busy_until, self.lazy_until,
            self.pace, self.queued_work, self.waiting_prompt, self.decode_context, self.keys)]


def blocks(tokens: np.ndarray, block_size: np.ndarray) -> np.ndarray:
    """``KVPool.blocks_for`` in vector form."""
    return -(-tokens // block_size)


def ascending(values: np.ndarray, ids: np.ndarray) -> Iterator[Ranked]:
    """(value, id) of each of ``ids`` (ascending), least value first, lowest id breaking ties;
    sorted lazily: the first ``FIRST`` and their ties, then the rest if a walk reaches them. (Walks
    by load floor go by the index's keys instead, ``LoadIndex.ordered``: an idle fleet ties
    hundreds at no load.) It calls numpy's array methods, not its functions of the same names:
    those are Python wrappers around them (0.3–0.7 µs more a call, measured with ``timeit``;
    every walk makes several)."""
    if len(ids) <= FIRST:
        return _pairs(values, ids, values.argsort(kind="stable"))
    least = values.copy()
    least.partition(FIRST - 1)
    first = (values <= least[FIRST - 1]).nonzero()[0]
    first = first[values[first].argsort(kind="stable")]
    return chain(_pairs(values, ids, first), _rest(values, ids, first))


def _pairs(values: np.ndarray, ids: np.ndarray, order: np.ndarray) -> Iterator[Ranked]:
    return zip(values[order].tolist(), ids[order].tolist(), strict=True)


def _rest(values: np.ndarray, ids: np.ndarray, first: np.ndarray) -> Iterator[Ranked]:
    """The workers past the first sorted ones, in order (sorted only when a walk reaches them)."""
    rest = np.ones(len(ids), bool)
    rest[first] = False
    left = rest.nonzero()[0]
    yield from _pairs(values[left], ids[left], values[left].argsort(kind="stable"))


def _by_key(keys: np.ndarray, span: int) -> Iterator[Ranked]:
    """(value, id) by key of value × ``span`` + id, least first: the first ``FIRST`` sorted, the
    rest only if a walk reaches them (an array of the caller's own: sorted in place)."""
    if len(keys) <= FIRST:
        keys.sort()
        return _keyed(keys, span)
    keys.partition(FIRST - 1)
    first = keys[:FIRST]
    first.sort()
    return chain(_keyed(first, span), _keyed_rest(keys[FIRST:], span))


def _keyed(keys: np.ndarray, span: int) -> Iterator[Ranked]:
    """The keys' (value, id) pairs, each split as a walk reads it (most walks read a few of the
    first ``FIRST``)."""
    return (divmod(key, span) for key in keys.tolist())


def _keyed_rest(keys: np.ndarray, span: int) -> Iterator[Ranked]:
    """The keys past the first ``FIRST``, in order (sorted, in place, only when a walk reaches
    them)."""
    keys.sort()
    yield from _keyed(keys, span)


def fleet_index(workers: Sequence[WorkerState]) -> LoadIndex | None:
    """The index that orders ``workers``, if they are an indexed fleet."""
    index = workers[0].index if workers else None
    return index if isinstance(index, LoadIndex) and index.of(workers) else None
