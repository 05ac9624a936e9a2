"""Requests no worker could ever serve are refused up front rather than left to wait forever."""

from __future__ import annotations

from collections.abc import Sequence

from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.sched.dispatch import ARRIVAL_ROLES, DECODING_ROLES, any_live
from tropical.sched.worker import WorkerState

NO_LIVE_WORKER = "no live worker can serve it"


def admission_error(req: Request, workers: Sequence[WorkerState],
                    max_context: int | None = None) -> str | None:
    """Why ``req`` can never run on ``workers``, or None when some worker could hold it (each
    test stops at the first live worker of its roles that passes it: every arrival asks)."""
    if max_context is not None and req.prompt_len + req.output_len > max_context:
        return (f"prompt of {req.prompt_len} plus {req.output_len} output tokens exceeds the "
                f"context window of {max_context}")
    if not any_live(workers, ARRIVAL_ROLES):
        return f"{NO_LIVE_WORKER}: none left takes new requests"
    if not any_live(workers, DECODING_ROLES):
        return f"{NO_LIVE_WORKER}: none left decodes"
    if not any_live(workers, ARRIVAL_ROLES, lambda w: w.kv.capacity_tokens >= w.kv_tokens_needed(req)):
        return f"prompt of {req.prompt_len} tokens exceeds every worker's KV cache"
    if not any_live(workers, DECODING_ROLES, lambda w: w.kv.capacity_tokens >= req.kv_tokens):
        return f"{req.kv_tokens} tokens of KV exceed every decoding worker's KV cache"
    return None


def serving_error(workers: Sequence[WorkerState]) -> str | None:
    """Why no new request could be served now (what /health reports), or None when one could:
    the admission rules applied to the smallest request."""
    return admission_error(Request(-1, 0.0, 1, 1, SLO(1.0, 1.0)), workers)
