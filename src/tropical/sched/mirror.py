"""The mirror of a self-scheduled worker: what a worker that plans its own iterations (a vLLM
instance) has run, booked into its WorkerState from the tokens it streamed.

A stepped worker runs the batch the Cluster plans, and ``Cluster.book`` books it. A self-scheduled
worker runs what it likes and shows only its streams, so the mirror books what they imply through
the same WorkerState methods:
- a request's first token there completes its prompt (on a worker that decodes, it decodes there
  from then on; elsewhere it waits for its hand-off, as after a stepped prefill);
- every running request decodes once per iteration, so the iteration count follows the stream
  furthest ahead (its tokens are observed iteration ends);
- between events, the iteration running there is the one batch formation would plan from the
  mirror's queue (``unplan`` drops that guess before the next event is booked).
Each event also teaches an online predictor: a prompt that ran alone is an observed prefill, the
time since the last event with no prompt queued observed decode iterations.
"""

from __future__ import annotations

from collections.abc import Sequence

from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.sched.rules import Role
from tropical.sched.worker import WorkerState

Streamed = Sequence[tuple[Request, int]]
"""Requests with the tokens each has streamed on the worker so far."""


def unplan(worker: WorkerState) -> None:
    """Return the prompts of the iteration planned last to the queue: a self-scheduled worker's
    plan is only the mirror's guess, made afresh at every event."""
    worker.start_prefills([])
    worker.queued_work = (sum(worker.prefill_cost(r) for r in worker.waiting)
                          if worker.role is Role.PREFILL else 0.0)


def book_streams(worker: WorkerState, streamed: Streamed, now: float,
                 since: float) -> tuple[list[tuple[Request, str]], list[Request]]:
    """Book what ``streamed`` shows by ``now`` (the last event here was at ``since``): the requests
    that finished at their length and the prompts that completed, as ``Cluster.book`` returns."""
    unplan(worker)
    worker.admit_inbox()
    finished: list[tuple[Request, str]] = []
    prefilled = [req for req, _ in streamed if req.id not in worker.running and req in worker.waiting]
    for req in prefilled:
        _complete_prompt(worker, req, now, since)
        if req.finish is not None:
            finished.append((req, "length"))
    finished += [(r, "length") for r in _advance(worker, streamed, now, since)]
    return finished, prefilled


def _complete_prompt(worker: WorkerState, req: Request, now: float, since: float) -> None:
    """``req``'s first token came: its whole prompt ran here. It holds KV here even where the
    mirror's pool (which reserves whole lifetimes, the worker only what it writes) is full: the
    worker admitted it."""
    alone = not worker.running and len(worker.waiting) == 1
    shape = BatchShape.prefill(req.remaining_prompt, req.computed)
    start = max(since, req.prefill_start if req.prefill_start is not None else since)
    if not worker.reserve(req):
        worker.holds[req.id] = 0
    worker.complete_prefill(req, req.remaining_prompt, now)
    if alone and now > start:
        worker.learn(shape, now - start)


def _advance(worker: WorkerState, streamed: Streamed, now: float, since: float) -> list[Request]:
    """Decode iterations up to the stream furthest ahead; the requests they finished."""
    target = max((req.step_base + tokens for req, tokens in streamed if req.id in worker.running),
                 default=worker.steps)
    steps = target - worker.steps
    if steps <= 0:
        return []
    if not worker.waiting and now > since:
        batch = worker.batch_size
        context = worker.decode_context + batch * (steps - 1) // 2
        worker.learn(BatchShape.decode(batch, context), (now - since) / steps, steps)
    finished: list[Request] = []
    while worker.steps < target and worker.running:
        finished += worker.advance_decodes(min(target - worker.steps, worker.steps_to_next_finish()), now)
    return finished
