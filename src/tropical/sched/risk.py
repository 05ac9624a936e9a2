"""Which queued prompts' TTFT is at risk on Path 1, kept between the toggle's questions.

A queued prompt is *at risk* when its predicted Path 1 finish (its worker free from ``start``,
then every prompt ahead of it, then its own) misses its TTFT SLO, and *doomed* when it would
miss even if it started now, alone; one that yielded its place (``Request.yielded``) gave its SLO
up for good, and is not at risk. The toggle asks at every iteration end of every worker,
for the first ``lookahead`` prompts of every prefill queue; but a prefill queue's answer
changes only when the queue does or its worker's next start moves (most iteration ends are
other workers'), and a prompt once doomed stays doomed. So a ``QueueRisk`` keeps one queue's
at-risk prompts, shortest first, and those of them not yet doomed; and ``AtRisk`` hands the
toggle the prompts of all queues one at a time, in its order, building only those it takes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Final, Generic, TypeVar

from tropical.core.request import Request

Owner = TypeVar("Owner")
Tag = TypeVar("Tag")
Priced = tuple[tuple[Request, float], ...]
"""A queue's first prompts in queue order, each with its predicted prefill time."""
Late = tuple[int, int, Request, float, float]
"""An at-risk prompt: its length, its place in the queue, itself, its cost and its Path 1 finish."""


def doomed(req: Request, cost: float, now: float) -> bool:
    """Would ``req``, costing ``cost`` here, miss its TTFT SLO even if it started ``now``?"""
    return now + cost - req.arrival > req.slo.ttft


DOOM_MARGIN: Final = 1e-6
"""Seconds by which a clock must precede a queue's first doom time for ``doomed`` to skip the
queue unread (doom times are sums taken in another order than ``doomed``'s, so they may differ
from its verdict in the last bits)."""


@dataclass(slots=True, eq=False)
class QueueRisk:
    """One priced queue's at-risk prompts with its worker free from ``start`` (``late``, by
    length then place), the same by place (``in_place``; none is doomed before ``first_doom``),
    and those not doomed at ``since`` (``open``, by length then place; none is doomed before
    ``open_doom``). It writes its constructor, which mypyc compiles (see ``BatchShape``)."""

    priced: Priced
    start: float
    late: list[Late]
    in_place: list[Late]
    open: list[Late]
    first_doom: float
    open_doom: float = math.inf
    since: float = -math.inf

    def __init__(self, priced: Priced, start: float, late: list[Late], in_place: list[Late],
                 open: list[Late], first_doom: float, open_doom: float = math.inf,
                 since: float = -math.inf) -> None:
        self.priced = priced
        self.start = start
        self.late = late
        self.in_place = in_place
        self.open = open
        self.first_doom = first_doom
        self.open_doom = open_doom
        self.since = since

    @classmethod
    def of(cls, priced: Priced, start: float) -> QueueRisk:
        """Finishes are added up one by one from ``start``, as the toggle has always priced them
        (a prompt that yielded delays those behind it, but is not at risk: it gave its TTFT SLO
        up for good); the doom times are taken in the same pass."""
        clock, in_place = start, []
        first_doom = math.inf
        for place, (req, cost) in enumerate(priced):
            clock += cost
            if not req.yielded and clock - req.arrival > req.slo.ttft:
                in_place.append((req.prompt_len, place, req, cost, clock))
                first_doom = min(first_doom, req.arrival + req.slo.ttft - cost)
        late = sorted(in_place)  # by length, then place (places differ: nothing further is compared)
        return QueueRisk(priced, start, late, in_place, late, first_doom, first_doom)

    def doomed_at(self, now: float) -> list[Late]:
        """The at-risk prompts doomed at ``now``, by place (asked at every iteration end of every
        worker: most find none newly doomed)."""
        if now + DOOM_MARGIN < self.first_doom:
            return []
        return [e for e in self.in_place if doomed(e[2], e[3], now)]

    def kept_for(self, priced: Priced, start: float) -> bool:
        """Does this still answer for ``priced`` with its worker free from ``start``? (An empty
        queue answers alike from any start: most prefill queues are empty most of the time, and
        the toggle asks each of them at every iteration end of every worker.)"""
        return self.priced is priced and (self.start == start or not priced)

    def open_at(self, now: float) -> list[Late]:
        """The at-risk prompts not doomed at ``now`` (read again only once one of them may be:
        under a burst a queue holds hundreds, and the toggle asks at every iteration end)."""
        if now < self.since:
            self.open, self.open_doom = self.late, _doom_time(self.late)
        if now != self.since and now + DOOM_MARGIN >= self.open_doom:
            self.open = [e for e in self.open if not doomed(e[2], e[3], now)]
            self.open_doom = _doom_time(self.open)
        self.since = now
        return self.open


def _doom_time(entries: list[Late]) -> float:
    """When the first of ``entries`` becomes doomed (each at its TTFT deadline less its cost)."""
    return min((e[2].arrival + e[2].slo.ttft - e[3] for e in entries), default=math.inf)


class AtRisk(Generic[Owner]):
    """The at-risk prompts of several queues (each with its owner, in scan order) at ``now``.
    (A plain class: compiled with mypyc, a generic dataclass fails to import.)"""

    __slots__ = ("queues", "now")

    def __init__(self, queues: Sequence[tuple[Owner, QueueRisk]], now: float) -> None:
        self.queues = queues
        self.now = now

    @property
    def count(self) -> int:
        return sum(len(risk.late) for _, risk in self.queues)

    def shortest_first(self, doomed_too: bool) -> Iterator[tuple[Request, Owner, float]]:
        """The prompts a path may still save, shortest first, ties in scan order; with
        ``doomed_too`` the doomed ones as well, each after the others of its length."""
        if doomed_too:
            entries = lost_last(_merged([(risk.late, owner) for owner, risk in self.queues]), self.now)
        else:
            entries = _merged([(risk.open_at(self.now), owner) for owner, risk in self.queues])
        for e, owner in entries:  # a loop, not a returned generator expression: compiled, that is a list
            yield e[2], owner, e[4]

    def doomed(self) -> list[tuple[Request, Owner, float]]:
        """The doomed prompts that have not yielded (when their queue was priced), in scan order."""
        return [(e[2], owner, e[4]) for owner, risk in self.queues for e in risk.doomed_at(self.now)]



def lost_last(merged: Iterator[tuple[Late, Tag]], now: float) -> Iterator[tuple[Late, Tag]]:
    """``merged`` (by length) with each run of one length reordered: the prompts doomed at
    ``now`` after the others."""
    for _, run in groupby(merged, key=_length):
        same = list(run)
        if len(same) == 1:
            yield same[0]
            continue
        lost = [doomed(e[2], e[3], now) for e, _ in same]
        yield from (t for t, gone in zip(same, lost, strict=True) if not gone)
        yield from (t for t, gone in zip(same, lost, strict=True) if gone)


def _length(tagged: tuple[Late, object]) -> int:
    return tagged[0][0]


def _merged(lists: list[tuple[list[Late], Owner]]) -> Iterator[tuple[Late, Owner]]:
    """One list per queue with its owner, each by length then place, merged by length then
    queue (most rounds find one or two queues at risk: those merge without a heap)."""
    tagged = [(entries, owner) for entries, owner in lists if entries]
    if len(tagged) > 2:
        return _merge(tagged)
    return _merge_two(tagged)


def _merge_two(tagged: list[tuple[list[Late], Owner]]) -> Iterator[tuple[Late, Owner]]:
    """At most two lists merged in ``_merge``'s order (ties to the first list), without its heap
    (the paper cluster has two prefill queues: the chained iterators that every round built for
    them, and the strict ``zip`` that paired the lists with their owners, were 3% of a full-rate
    ``tropical+`` run's instructions)."""
    if not tagged:
        return
    first, owner = tagged[0]
    second, other = tagged[1] if len(tagged) > 1 else ([], owner)
    i = j = 0
    while i < len(first) or j < len(second):
        if i == len(first) or (j < len(second) and second[j][0] < first[i][0]):
            yield second[j], other
            j += 1
        else:
            yield first[i], owner
            i += 1


def _merge(tagged: list[tuple[list[Late], Owner]]) -> Iterator[tuple[Late, Owner]]:
    """The lists merged lazily by length, ties by list then place: ``heapq.merge``'s order, from
    a heap of (length, list, place) in a generator function, which mypyc compiles (``heapq.merge``
    is a Python generator that wraps every entry with its key: under a burst, a sixth of the
    simulation's time went to it)."""
    heap = [(entries[0][0], which, 0) for which, (entries, _) in enumerate(tagged)]
    heapq.heapify(heap)
    while heap:
        _, which, place = heap[0]
        entries, owner = tagged[which]
        yield entries[place], owner
        if place + 1 < len(entries):
            heapq.heapreplace(heap, (entries[place + 1][0], which, place + 1))
        else:
            heapq.heappop(heap)
