"""Requests no worker could ever serve are refused up front rather than left to wait forever."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.sched.dispatch import ARRIVAL_ROLES, DECODING_ROLES, first_live
from tropical.sched.rules import Role
from tropical.sched.worker import WorkerState

NO_LIVE_WORKER: Final = "no live worker can serve it"


@dataclass(slots=True)
class Witnesses:
    """The worker that last passed each of ``admission_error``'s tests, asked first the next
    time: every arrival asks every test, and on a large fleet the first worker of a role may sit
    behind hundreds of others (a toggle's decoding workers behind its prefill workers)."""

    found: dict[str, WorkerState] = field(default_factory=dict)

    def passes(self, test_name: str, workers: Sequence[WorkerState], roles: Sequence[Role],
               test: Callable[[WorkerState], bool] | None = None) -> bool:
        """Does some live worker of ``roles`` pass ``test``: the last one that did (if it is
        still the fleet's, by id: a revived worker is a new one), or the first one found?"""
        kept = self.found.get(test_name)
        if (kept is not None and kept.id < len(workers) and workers[kept.id] is kept and kept.alive
                and kept.role in roles and (test is None or test(kept))):
            return True
        found = first_live(workers, roles, test)
        if found is None:
            return False
        self.found[test_name] = found
        return True


def admission_error(req: Request, workers: Sequence[WorkerState], max_context: int | None = None,
                    witnesses: Witnesses | None = None) -> str | None:
    """Why ``req`` can never run on ``workers``, or None when some worker could hold it (each
    test stops at the first live worker of its roles that passes it, and asks the one that last
    passed it first: every arrival asks)."""
    seen = Witnesses() if witnesses is None else witnesses
    if max_context is not None and req.prompt_len + req.output_len > max_context:
        return (f"prompt of {req.prompt_len} plus {req.output_len} output tokens exceeds the "
                f"context window of {max_context}")
    if not seen.passes("arrivals", workers, ARRIVAL_ROLES):
        return f"{NO_LIVE_WORKER}: none left takes new requests"
    if not seen.passes("decodes", workers, DECODING_ROLES):
        return f"{NO_LIVE_WORKER}: none left decodes"
    if not seen.passes("prompt fits", workers, ARRIVAL_ROLES,
                       lambda w: w.kv.capacity_tokens >= w.kv_tokens_needed(req)):
        return f"prompt of {req.prompt_len} tokens exceeds every worker's KV cache"
    if not seen.passes("KV fits", workers, DECODING_ROLES, lambda w: w.kv.capacity_tokens >= req.kv_tokens):
        return f"{req.kv_tokens} tokens of KV exceed every decoding worker's KV cache"
    return None


def serving_error(workers: Sequence[WorkerState]) -> str | None:
    """Why no new request could be served now (what /health reports), or None when one could:
    the admission rules applied to the smallest request."""
    return admission_error(Request(-1, 0.0, 1, 1, SLO(1.0, 1.0)), workers)
