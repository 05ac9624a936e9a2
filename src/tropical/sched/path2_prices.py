"""Path 2's prices kept between decisions, for as long as they cannot have moved.

The toggle re-examines the prompts at risk at every iteration end of every worker, and prices
each against a shortlist of multiplexing workers. Most of those events are other workers': the
multiplexing worker it prices is in the middle of an iteration, and neither it nor the prompt
has changed since the last time. Its price then is the same (its next iteration starts when the
current one ends, not at the decision's clock), so it is kept, not computed again. Under a burst
at a thousand workers nearly every price is such a repeat.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tropical.core.request import Request
from tropical.sched.worker import WorkerState

KEPT: Final = 1 << 18
"""Prices kept at most: beyond, all are dropped (those of prompts long gone among them)."""


@dataclass(slots=True)
class _Price:
    """A price and what it was computed from: the worker (the object, so that a revived worker
    with the same id never matches), its edit count, and the prompt's progress, source worker
    and whether it yielded (what the price reads of the prompt that can move while it waits).
    A value: never change one (one per price kept; it writes its constructor, which mypyc
    compiles, see ``BatchShape``)."""

    worker: WorkerState
    edits: int
    computed: int
    source: int | None
    yielded: bool
    finish: float | None

    def __init__(self, worker: WorkerState, edits: int, computed: int, source: int | None,
                 yielded: bool, finish: float | None) -> None:
        self.worker = worker
        self.edits = edits
        self.computed = computed
        self.source = source
        self.yielded = yielded
        self.finish = finish


class Path2Prices:
    """The finish a multiplexing worker would give a prompt (None: it may not take it), by
    prompt and worker, valid while the worker stays busy past the decision and unedited."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[tuple[int, int], _Price] = {}

    def price(self, req: Request, worker: WorkerState, now: float,
              compute: Callable[[], float | None]) -> float | None:
        """The kept price of ``req`` on ``worker`` if it still holds, else ``compute()``'s. A price
        is kept only while the worker is busy at ``now``: an idle worker starts its next
        iteration at the decision's clock, so its price moves with it."""
        kept = self.kept(req, worker, now)
        if kept is not None:
            return kept.finish
        finish = compute()
        if worker.busy_until > now:
            if len(self._kept) >= KEPT:
                self._kept = {}
            self._kept[(req.id, worker.id)] = _Price(worker, worker.edits, req.computed,
                                                     req.prefill_worker, req.yielded, finish)
        return finish

    def kept(self, req: Request, worker: WorkerState, now: float) -> _Price | None:
        """The price of ``req`` on ``worker`` kept from an earlier decision, if it still holds."""
        if worker.busy_until <= now:  # read first: it books a lazy decode run's iterations
            return None
        kept = self._kept.get((req.id, worker.id))
        if (kept is not None and kept.worker is worker and kept.edits == worker.edits
                and kept.computed == req.computed and kept.source == req.prefill_worker
                and kept.yielded == req.yielded):
            return kept
        return None
