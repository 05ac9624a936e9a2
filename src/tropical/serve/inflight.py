"""The requests the router is serving: each one's stream to its client and the tokens its worker's
next step is given, and every way a stream ends (finished, stopped, failed, or left by its client).

The Cluster decides when a request ends; this keeps the streams, the token sequences and the
counts in /metrics consistent however it ends.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from tropical.core.request import Request
from tropical.core.sampling import TokenLogprobs
from tropical.sched.step import TokenSequence
from tropical.serve.metrics import ServerMetrics
from tropical.serve.streams import RequestHandle, Submission

if TYPE_CHECKING:  # the tokenizer's module loads torch (GGUF vocabularies); the router does not
    from tropical.engine.tokenizer import Tokenizer


class InFlight:
    """Streams (``handles``) and token sequences (``sequences``) of the requests in flight, by id."""

    def __init__(self, tokenizer: Tokenizer, metrics: ServerMetrics, clock: Callable[[], float]) -> None:
        self.tokenizer = tokenizer
        self.eos = frozenset(tokenizer.eos_token_ids)
        self.metrics = metrics
        self.clock = clock
        self.handles: dict[int, RequestHandle] = {}
        self.sequences: dict[int, TokenSequence] = {}

    def open(self, req: Request, submission: Submission) -> RequestHandle:
        """An admitted request's stream, and its tokens for the steps to come."""
        handle = RequestHandle.of(req, submission, self.tokenizer)
        self.handles[req.id] = handle
        self.track(req, submission)
        return handle

    def track(self, req: Request, submission: Submission) -> None:
        """``req``'s tokens from its prompt on (again, for a request that runs again, with a
        fresh grammar matcher)."""
        constraint = submission.constraint() if submission.constraint is not None else None
        self.sequences[req.id] = TokenSequence(req, list(submission.prompt_ids), submission.params,
                                               submission.ignore_eos, constraint=constraint)

    def stream(self, tokens: Mapping[int, int], finished: list[tuple[Request, str]],
               ended: Collection[int] = (), logprobs: Mapping[int, TokenLogprobs] | None = None
               ) -> list[int]:
        """Send a step's tokens, with their ``logprobs`` (and a request's first token with its
        prompt logprobs); the token that ``ended`` a request (an end of sequence or stop token id)
        adds no text. End the streams of requests that finished or hit a stop string; returns
        those a stop string ended: the scheduler still holds them, with their KV."""
        stopped = []
        ending = set(ended)
        scored = logprobs or {}
        for rid, token in tokens.items():
            handle = self.handles.get(rid)
            if handle is None:
                continue
            logprob = [scored[rid]] if rid in scored else None
            if handle.emit([token], logprob, self._prompt_logprobs(handle), silent=rid in ending):
                self._finish(handle, "stop")
                stopped.append(rid)
        for req, reason in finished:
            self.sequences.pop(req.id, None)
            handle = self.handles.get(req.id)
            if handle is not None:
                self._finish(handle, "stop" if reason == "eos" else "length")
        return stopped

    def _prompt_logprobs(self, handle: RequestHandle) -> list[TokenLogprobs | None] | None:
        """The prompt's logprobs, first None, to send with a request's first token, if it asked."""
        seq = self.sequences.get(handle.req.id)
        if handle.completion_tokens or seq is None or seq.params.prompt_logprobs is None:
            return None
        return [None, *seq.prompt_logprobs]

    def _finish(self, handle: RequestHandle, reason: str) -> None:
        """End the stream and record the request's latencies as it really ran: a stop (string or
        eos) ends it before ``output_len``, which the scheduler's copy must keep until dropped."""
        req = self.handles.pop(handle.req.id).req
        tokens = max(1, handle.completion_tokens)
        finish = req.finish if req.finish is not None else self.clock()
        handle.end(reason)
        self.metrics.observe_finished(replace(req, output_len=tokens, generated=tokens, finish=finish))
        self.metrics.record_request("finished")

    def leave(self, rid: int) -> bool:
        """The client went away: send nothing more; False if its stream had ended already."""
        handle = self.handles.pop(rid, None)
        if handle is None:
            return False
        handle.ended = True
        self.metrics.record_request("aborted")
        return True

    def forget(self, rid: int) -> None:
        """The scheduler has dropped ``rid``: its tokens will not be stepped again."""
        self.sequences.pop(rid, None)

    def fail(self, req: Request, reason: str, status: int = 503) -> None:
        """End ``req``'s stream with ``reason`` (unless it ended, or was re-run as a new request):
        the cluster has dropped it, so the server could not serve it (503), or refused it while
        it queued (429)."""
        handle = self.handles.get(req.id)
        if handle is None or handle.req is not req:
            return
        self.sequences.pop(req.id, None)
        self.end_with_error(handle, reason, status)

    def end_with_error(self, handle: RequestHandle, reason: str, status: int) -> None:
        """End a stream with an error event mapped to ``status`` (503: the server could not serve
        it now; 500: an internal failure); the cluster's copy is the caller's business."""
        del self.handles[handle.req.id]
        handle.req.fail(self.clock(), reason)
        handle.end(error=reason, status=status)
        self.metrics.record_request("failed")

    def lost(self, req: Request, worker_id: int) -> RequestHandle | None:
        """``req``'s worker died: its handle, to run it again from its prompt, if it has streamed
        nothing yet and did not ask not to be retried; otherwise its stream ends saying why."""
        handle = self.handles.get(req.id)
        if handle is None:
            return None
        if handle.completion_tokens == 0 and handle.submission.retry:
            return handle
        why = (f"after this request had generated {handle.completion_tokens} tokens (a request "
               f"runs again elsewhere only before its first token)" if handle.completion_tokens
               else "and this request asked not to be retried")
        self.fail(req, f"worker {worker_id} died {why}")
        return None
