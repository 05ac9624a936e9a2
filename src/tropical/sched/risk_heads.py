"""The at-risk prompts of every watched prefill queue, merged shortest first, kept across rounds.

Under a burst at a thousand workers about two hundred prefill queues hold prompts at risk, and
the toggle asks at every iteration end of every worker. Most rounds read one prompt (the shortest
that a path may still save, which then fits nowhere) and stop; yet merging the queues' lists
afresh, and asking each queue for its doomed prompts, cost each round every queue: a quarter of
the burst's time (a third for the paper's toggle, which merges every at-risk prompt, doomed
ones too). A queue's lists change only when it is priced again or, for the prompts not yet
doomed, when the clock passes the time the first of them becomes doomed. So ``RiskHeads`` keeps
four heaps over the queues at risk: their first at-risk prompts and their first open prompts
(each by length, then worker id: the merge's order), the times their open prompts next become
doomed, and the times their first prompt that has not yielded does. A round reads one of the
first two heaps in order without popping it, so only the queues it reaches cost it. Queues are
filed when a round first reads the heaps, and a round that finds at most ``DIRECT`` queues at
risk merges them directly, as before (a small fleet's one or two prefill queues cost less to
merge than to keep in heaps: with heaps alone a 4-worker run counted 1-3% more instructions).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Final, Generic, TypeVar

from tropical.core.request import Request
from tropical.sched.risk import DOOM_MARGIN, AtRisk, Late, QueueRisk, lost_last

Owner = TypeVar("Owner")
DIRECT: Final = 2
"""A round that finds at most this many queues at risk merges them directly (``AtRisk``)."""
_Head = tuple[int, int, int]
"""A queue's first (at-risk or open) prompt's length, the queue's worker id, and the filing it
belongs to."""
_Due = tuple[float, int, int]
"""A time, a queue's worker id, and the filing it belongs to."""
Entry = TypeVar("Entry", _Head, _Due)


class RiskHeads:
    """The queues at risk (``risks``, by worker id, the watch's own answers; each filed under a
    version, ``version``) in four heaps, entries of older filings left in place until a heap
    outgrows its queues: ``lates`` (first at-risk prompt's length, id), ``heads`` (first open
    prompt's length, id), ``dooms`` (when an open prompt next becomes doomed) and
    ``first_dooms`` (when a prompt that has not yielded first becomes doomed); ``dooming``
    holds the ids of queues whose first doom has passed, and ``unfiled`` the queues looked at
    since the heaps were last read, each with whether it holds prompts at risk. (A plain
    class, as ``AtRisk``.)"""

    __slots__ = ("risks", "version", "lates", "heads", "dooms", "first_dooms", "dooming", "unfiled",
                 "_stamps")

    def __init__(self, risks: Mapping[int, QueueRisk]) -> None:
        self.risks = risks
        self.version: dict[int, int] = {}
        self.lates: list[_Head] = []
        self.heads: list[_Head] = []
        self.dooms: list[_Due] = []
        self.first_dooms: list[_Due] = []
        self.dooming: set[int] = set()
        self.unfiled: dict[int, bool] = {}
        self._stamps = itertools.count()

    def mark(self, worker_id: int, late: bool) -> None:
        """The queue of ``worker_id`` was looked at: file it afresh (its answer
        ``risks[worker_id]``) at the next read, or take it out where it holds no prompt at risk."""
        self.unfiled[worker_id] = late

    def _file(self, worker_id: int, late: bool, now: float) -> None:
        """File the queue of ``worker_id`` afresh at ``now``, or take it out."""
        self.dooming.discard(worker_id)
        if not late:
            self.version.pop(worker_id, None)
            return
        stamp = self.version[worker_id] = next(self._stamps)
        risk = self.risks[worker_id]
        if risk.late:
            heapq.heappush(self.lates, (risk.late[0][0], worker_id, stamp))
        opened = risk.open_at(now)
        if opened:
            heapq.heappush(self.heads, (opened[0][0], worker_id, stamp))
            heapq.heappush(self.dooms, (risk.open_doom, worker_id, stamp))
        if risk.first_doom <= now + DOOM_MARGIN:
            self.dooming.add(worker_id)
        elif risk.first_doom < math.inf:
            heapq.heappush(self.first_dooms, (risk.first_doom, worker_id, stamp))

    def advance(self, now: float) -> None:
        """Bring the heaps to ``now``: the queues looked at since the last read are filed, those
        whose open prompts may have become doomed are filed again (each once), those whose first
        doom has passed join ``dooming``, entries of older filings leave the tops of the heaps
        read in order, and the heaps are compacted (once per read, not per filing)."""
        for worker_id, late in self.unfiled.items():
            self._file(worker_id, late, now)
        self.unfiled.clear()
        due = []
        while self.dooms and self.dooms[0][0] <= now + DOOM_MARGIN:
            _, worker_id, stamp = heapq.heappop(self.dooms)
            if self._current(worker_id, stamp):
                due.append(worker_id)
        for worker_id in due:
            self._file(worker_id, True, now)
        while self.first_dooms and self.first_dooms[0][0] <= now + DOOM_MARGIN:
            _, worker_id, stamp = heapq.heappop(self.first_dooms)
            if self._current(worker_id, stamp):
                self.dooming.add(worker_id)
        for heap in (self.lates, self.heads):
            while heap and not self._current(heap[0][1], heap[0][2]):
                heapq.heappop(heap)
        self._compact()

    def _current(self, worker_id: int, stamp: int) -> bool:
        return self.version.get(worker_id) == stamp

    def _compact(self) -> None:
        """Drop the entries of older filings once a heap holds more than twice the live ones."""
        room = 2 * len(self.version) + 64
        if len(self.lates) > room:
            self.lates = self._kept(self.lates)
        if len(self.heads) > room:
            self.heads = self._kept(self.heads)
        if len(self.dooms) > room:
            self.dooms = self._kept(self.dooms)
        if len(self.first_dooms) > room:
            self.first_dooms = self._kept(self.first_dooms)

    def _kept(self, heap: list[Entry]) -> list[Entry]:
        """``heap``'s entries of current filings, as a heap."""
        kept = [e for e in heap if self._current(e[1], e[2])]
        heapq.heapify(kept)
        return kept

    def merged(self, opened: bool) -> Iterator[tuple[Late, int]]:
        """Every queue's open prompts (as filed; ``opened``) or at-risk prompts, by length, then
        worker id, then place: their heap (``heads`` or ``lates``) is read in order through a
        second heap of its indices (it is not popped), and a queue's prompts join the merge only
        once its first is reached (older filings' entries are passed over only where they come
        before the next prompt)."""
        heap = self.heads if opened else self.lates
        explore: list[tuple[_Head, int]] = [(heap[0], 0)] if heap else []
        merging: list[_Head] = []
        while True:
            if merging and (not explore or merging[0][:2] < explore[0][0][:2]):
                _, worker_id, place = merging[0]
                risk = self.risks[worker_id]
                entries = risk.open if opened else risk.late
                yield entries[place], worker_id
                if place + 1 < len(entries):
                    heapq.heapreplace(merging, (entries[place + 1][0], worker_id, place + 1))
                else:
                    heapq.heappop(merging)
            elif explore:
                length, worker_id, stamp = explore[0][0]
                self._explored(heap, explore)
                if self._current(worker_id, stamp):
                    heapq.heappush(merging, (length, worker_id, 0))
            else:
                return

    @staticmethod
    def _explored(heap: list[_Head], explore: list[tuple[_Head, int]]) -> None:
        """Take the least entry off ``explore`` and put its children in ``heap`` on."""
        _, at = heapq.heappop(explore)
        for child in (2 * at + 1, 2 * at + 2):
            if child < len(heap):
                heapq.heappush(explore, (heap[child], child))


class KeptAtRisk(Generic[Owner]):
    """``AtRisk``'s answers read off a watch's kept heaps: the queues at risk (``late``, ids
    ascending, owners in ``by_id``) at ``now``, merged directly where at most ``direct`` are.
    (A plain class, as ``AtRisk``.)"""

    __slots__ = ("heads", "late", "by_id", "now", "direct", "_queues")

    def __init__(self, heads: RiskHeads, late: list[int], by_id: Mapping[int, Owner], now: float,
                 direct: int = DIRECT) -> None:
        self.heads = heads
        self.late = late
        self.by_id = by_id
        self.now = now
        self.direct = direct
        self._queues: list[tuple[Owner, QueueRisk]] | None = None

    @property
    def queues(self) -> list[tuple[Owner, QueueRisk]]:
        """Each queue at risk with its owner, by id (``AtRisk``'s input; listed once: a round
        asks for its prompts to save and for its doomed ones)."""
        if self._queues is None:
            self._queues = [(self.by_id[wid], self.heads.risks[wid]) for wid in self.late]
        return self._queues

    @property
    def count(self) -> int:
        return sum(len(self.heads.risks[wid].late) for wid in self.late)

    def shortest_first(self, doomed_too: bool) -> Iterator[tuple[Request, Owner, float]]:
        """As ``AtRisk.shortest_first``, from the kept heaps where more than ``direct`` queues
        are at risk. (A direct merge drops from a queue's open prompts only those doomed by now,
        and the heaps file such a queue again at their next read: its next doom is due.)"""
        if len(self.late) <= self.direct:
            return AtRisk(self.queues, self.now).shortest_first(doomed_too)
        return self._from_heads(doomed_too)

    def _from_heads(self, doomed_too: bool) -> Iterator[tuple[Request, Owner, float]]:
        """The prompts off the heaps (a generator apart from ``shortest_first``, so that the
        direct merges pass through no second generator)."""
        self.heads.advance(self.now)
        merged = self.heads.merged(not doomed_too)
        for e, worker_id in lost_last(merged, self.now) if doomed_too else merged:
            yield e[2], self.by_id[worker_id], e[4]

    def doomed(self) -> list[tuple[Request, Owner, float]]:
        """As ``AtRisk.doomed``: only the queues whose first doom has passed are asked (all of
        them where at most ``direct`` are at risk)."""
        if len(self.late) <= self.direct:
            return AtRisk(self.queues, self.now).doomed()
        self.heads.advance(self.now)
        risks = self.heads.risks
        return [(e[2], self.by_id[wid], e[4]) for wid in sorted(self.heads.dooming)
                for e in risks[wid].doomed_at(self.now)]
