"""What the toggle computes of a multiplexing worker to price prompts on it, kept between its
scheduling rounds while the worker cannot have moved.

Pricing a prompt on Path 2 reads the worker's next iteration (its decodes, and when it starts),
the prompts queued there, and those prompts lined up for placing a candidate among them. Each
is a pass over the worker's batch or queue. A scheduling round (an arrival, or an iteration end
of any worker) used to compute them afresh for every worker it priced; but most rounds are
other workers' events, and a worker in the middle of an iteration, unedited since, has the same
next iteration (it starts when the current one ends, not at the round's clock) and the same
queue. Under a burst at a thousand workers each round prices a dozen workers, nearly all such.

So a view is kept while its worker is the same object (a revived worker is a new one), with the
same edit count and the same iteration end, and busy past the round's clock. Not kept across
rounds: a view of a worker that learns its predictions online (its prompts' prices move without
an edit), or whose prefix cache has a host tier (a shared one changes with other workers'
edits), or that a round promised a prompt to (its queue then holds the promise).
"""

from __future__ import annotations

from dataclasses import dataclass

from tropical.core.request import Request
from tropical.sched.chunk import Lineup
from tropical.sched.next_iteration import NextIteration
from tropical.sched.pending import Pending
from tropical.sched.worker import WorkerState


@dataclass(slots=True)
class WorkerView:
    """One worker as priced from ``round`` on: its next iteration, and (filled in as asked) its
    queue with this round's promises, their lineup, the sums of the queue alone, and how many
    prompts it has taken and with what contexts they will decode there (``joining_now``). It
    writes its constructor, which mypyc compiles (see ``BatchShape``)."""

    worker: WorkerState
    edits: int
    until: float
    round: int
    next: NextIteration
    queue: list[Request] | None = None
    lineup: Lineup | None = None
    queued: Pending | None = None
    joining: tuple[int, int] | None = None
    promised: bool = False

    def __init__(self, worker: WorkerState, edits: int, until: float, round: int,
                 next: NextIteration) -> None:
        self.worker = worker
        self.edits = edits
        self.until = until
        self.round = round
        self.next = next
        self.queue = None
        self.lineup = None
        self.queued = None
        self.joining = None
        self.promised = False

    def queue_now(self) -> list[Request]:
        """The prompts queued on the worker and those promised to it in this round."""
        if self.queue is None:
            self.queue = list(self.next.queued)
        return self.queue

    def lineup_now(self, laxity: bool) -> Lineup:
        """The queue with this round's promises, lined up for placing a candidate among them."""
        if self.lineup is None:
            self.lineup = Lineup.of(self.worker, self.queue_now(), self.next.carried, laxity)
        return self.lineup

    def queued_now(self) -> Pending:
        """The prompts queued on the worker (not yet running; no promise)."""
        if self.queued is None:
            self.queued = Pending.of(self.worker, self.next.queued, self.next.carried)
        return self.queued

    def joining_now(self) -> tuple[int, int]:
        """The prompts queued on the worker, promised to it in this round or chunked in its
        iteration in flight, and the sum of their prompts: the decodes they become there."""
        if self.joining is None:
            queue, carried = self.queue_now(), self.next.carried
            context = sum(req.prompt_len for req in queue) + sum(req.prompt_len for req, _ in carried)
            self.joining = (len(queue) + len(carried), context)
        return self.joining

    def promise(self, req: Request) -> None:
        """This round promised ``req`` to the worker: it joins the queue, and the lineup is
        lined up again when next asked; the view serves no later round."""
        self.queue_now().append(req)
        self.lineup = None
        self.joining = None
        self.promised = True


class WorkerViews:
    """The views of the workers priced so far, by worker id, and the current round's number."""

    __slots__ = ("_views", "_round")

    def __init__(self) -> None:
        self._views: dict[int, WorkerView] = {}
        self._round = 0

    def new_round(self) -> None:
        self._round += 1

    def of(self, worker: WorkerState, now: float) -> WorkerView:
        """``worker``'s view in this round: the one this round built or carried, else the kept
        one where it holds, else a new one."""
        view = self._views.get(worker.id)
        if view is not None and view.round == self._round and view.worker is worker:
            return view
        until = worker.busy_until  # read first: it books a lazy decode run's iterations
        if view is None or not self._carries(view, worker, until, now):
            view = self._views[worker.id] = WorkerView(worker, worker.edits, until, self._round,
                                                       NextIteration.of(worker, now))
        return view

    def _carries(self, view: WorkerView, worker: WorkerState, until: float, now: float) -> bool:
        """Does an earlier round's ``view`` still hold (and then serve this round)?"""
        if view.worker is not worker or view.edits != worker.edits:
            return False
        if view.promised or until <= now or view.until != until or worker.learns:
            return False
        cache = worker.kv.cache
        if cache is not None and cache.host is not None:
            return False
        view.round = self._round
        return True
