"""Load-balancing choices shared by every policy (InFaaS-style: fewest unfinished tokens)."""

from __future__ import annotations

from collections.abc import Iterable

from tropical.core.request import Request
from tropical.sched.worker import WorkerState


def fewest_unfinished(workers: Iterable[WorkerState]) -> WorkerState | None:
    """The live worker with the least outstanding work (lowest id breaks ties)."""
    live = [w for w in workers if w.alive]
    return min(live, key=lambda w: (w.unfinished_tokens, w.id)) if live else None


def least_work(req: Request, workers: Iterable[WorkerState]) -> WorkerState | None:
    """The live worker with the least outstanding work once it took ``req``: its unfinished
    tokens plus the prompt tokens of ``req`` its prefix cache lacks (lowest id breaks ties;
    without a cache, the same choice as ``fewest_unfinished``)."""
    live = [w for w in workers if w.alive]
    return min(live, key=lambda w: (w.unfinished_tokens + w.prompt_split(req)[0], w.id)) if live else None


def decode_destination(req: Request, workers: Iterable[WorkerState]) -> WorkerState | None:
    """Where a prefilled request should decode: fewest unfinished tokens among those with room."""
    return fewest_unfinished(
        w for w in workers
        if w.role.decodes and w.can_hold(req) and w.batch_size < w.rules.max_seqs
    )
