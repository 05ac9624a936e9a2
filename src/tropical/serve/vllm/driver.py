"""vLLM instances driven by sched's ``Cluster``: the Cluster decides, this carries out its effects
over HTTP.

A vLLM instance plans its own iterations, so the Cluster keeps a mirror of each (``sched.mirror``):
every streamed chunk is an observed iteration end (``Cluster.observe``), and a new request sent
there joins the iteration the mirror plans (``Cluster.replan``, on ``Wake``). Each request runs
as one task on the instance its ``Assigned`` effect names:
- on a prefill instance (Path 1) the prompt goes with ``max_tokens: 1`` and
  ``kv_transfer_params: {"do_remote_decode": true}``; its reply completes the prompt, and the
  Cluster's ``Migrate`` (at once, or when a stalled hand-off finds room) sends the same request
  with the reply's ``kv_transfer_params`` to the decode instance, which pulls the KV through
  vLLM's connector (NIXL); its first token lands the KV (``Cluster.migrated``), and its stream is
  the client's;
- on any other instance (Path 2) the prompt streams from there.
Each mirror keeps a model of its instance's prefix cache (``sched.prefix_cache``, an LRU over the
instance's KV blocks, in its block size): a prompt's first token there stores its blocks, as vLLM
caches what it computed, so cache-aware policies price the hits each instance would give. What the
instance really found cached comes back in each reply's ``usage.prompt_tokens_details`` and is the
request's ``cached_tokens`` and that instance's prefix-cache counters (``docs/vllm.md`` says why
this and not vLLM's KV events).
An instance that dies leaves the Cluster; its requests without a token yet run again elsewhere,
the others end with an error, as with our own workers; then it is restarted with its role and
port (an attached one is waited for) and re-added (``revivals`` in /metrics).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import aclosing
from functools import partial
from typing import TYPE_CHECKING, Any

from tropical.core.latency.model import LatencyModel
from tropical.core.request import Request
from tropical.core.sampling import SamplingParams
from tropical.sched.cluster import Assigned, Migrate
from tropical.sched.policy import Policy
from tropical.sched.rules import Role
from tropical.sched.worker import WorkerState
from tropical.serve.metrics import ServerMetrics
from tropical.serve.router import Rejected, RouterBase, RouterSettings, cancel
from tropical.serve.streams import RequestHandle, Submission
from tropical.serve.vllm.instance import InstanceDied, InstanceError, VllmInstance, cached_tokens

if TYPE_CHECKING:  # the tokenizer's module loads torch (GGUF vocabularies); the driver does not
    from tropical.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}
PROBE_INTERVAL_S = 1.0
RESTART_PAUSE_S = 5.0


class VllmDriver(RouterBase[VllmInstance]):
    """The Cluster over vLLM instances, the instances, and the requests in flight."""

    WORKER = "vLLM instance"

    def __init__(self, policy: Policy, workers: Sequence[WorkerState], instances: Sequence[VllmInstance],
                 tokenizer: Tokenizer, reference: LatencyModel, settings: RouterSettings,
                 metrics: ServerMetrics, start_timeout: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(policy, workers, instances, tokenizer, reference, settings, metrics, clock)
        self.start_timeout = start_timeout
        self._tasks: dict[int, asyncio.Task] = {}
        self._handoffs: dict[int, dict[str, Any]] = {}
        self._background: set[asyncio.Task] = set()
        for i, instance in enumerate(self.clients):
            instance.on_death = partial(self._worker_died, i)

    def start(self) -> None:
        self._spawn(self._watch(), "vllm-watch")
        super().start()

    async def stop(self) -> None:
        await cancel([*self._tasks.values(), *self._background])
        for instance in self.clients:
            await instance.close()

    def submit(self, submission: Submission) -> RequestHandle:
        """Refuse what the router cannot carry back from vLLM (400), then admit as any router."""
        unsupported = unsupported_over_vllm(submission)
        if unsupported is not None:
            raise Rejected(400, f"{unsupported} is not supported with --engine vllm: the router streams "
                                f"token ids from the instances and does not yet carry it back (use "
                                f"--engine tropical)")
        return super().submit(submission)

    def _stop(self, rid: int) -> None:
        """Closing the request's connection to vLLM aborts it there and frees its KV."""
        self._drop(rid)

    def _release(self, rid: int) -> None:
        """End ``rid``'s task and forget its hand-off."""
        self._cancel(rid)
        self._handoffs.pop(rid, None)

    def _cancel(self, rid: int) -> None:
        task = self._tasks.pop(rid, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _assigned(self, placed: Assigned) -> None:
        self._run(placed.request, placed.worker_id, None)

    def _wake(self, worker_id: int) -> None:
        """A new request joins the iteration the mirror plans."""
        self.cluster.replan(worker_id, self.clock())
        self._report(self.workers[worker_id])

    def _migrate(self, move: Migrate) -> None:
        """The decode instance pulls the KV when it gets the request with the prefill's reply."""
        self._run(move.request, move.target, move)

    def _run(self, req: Request, worker_id: int, move: Migrate | None) -> None:
        """Start ``req``'s task on ``worker_id`` (in place of one elsewhere: the policy moved it)."""
        self._cancel(req.id)
        task = asyncio.create_task(self._serve(req, worker_id, move), name=f"request-{req.id}")
        self._tasks[req.id] = task

    async def _serve(self, req: Request, worker_id: int, move: Migrate | None) -> None:
        """One request on one instance, failures included (a death is the death's business)."""
        try:
            if move is None and self.workers[worker_id].role is Role.PREFILL:
                await self._prefill(req, worker_id)
            else:
                await self._stream(req, worker_id, move)
        except InstanceDied:
            pass
        except InstanceError as exc:
            self._failed(req, move, str(exc))
        finally:
            if self._tasks.get(req.id) is asyncio.current_task():
                del self._tasks[req.id]

    async def _prefill(self, req: Request, worker_id: int) -> None:
        """Path 1: the prompt alone; the Cluster then hands it off (a one-token answer ends here)."""
        reply = await self.clients[worker_id].complete({**self._body(req), "max_tokens": 1,
                                                        "kv_transfer_params": REMOTE_DECODE})
        params = reply.get("kv_transfer_params")
        if params is None and req.output_len > 1:
            self._fail(req.id, f"prefill instance {worker_id} returned no kv_transfer_params; was it "
                               f"started with a KV connector (--kv-transfer-config)?")
            return
        self._handoffs[req.id] = params or {}
        booking = self.cluster.observe(worker_id, self.clock(), {req.id: 1})
        self._prefix_hit(req, worker_id, cached_tokens(reply))
        if req.finish is not None:
            self._handoffs.pop(req.id, None)
            tokens = reply["choices"][0].get("token_ids") or []
            self.inflight.stream({req.id: tokens[0]} if tokens else {}, [(req, "length")])
        self._carry_out(booking.effects)

    async def _stream(self, req: Request, worker_id: int, move: Migrate | None) -> None:
        """Stream the instance's tokens to the client, each chunk an observed iteration end there.
        After a hand-off, the first token says the KV has landed. The usage chunk after the last
        token says what the instance found cached (after a hand-off, the prefill's hit counts)."""
        body = self._body(req)
        if move is not None:
            body["kv_transfer_params"] = self._handoffs.pop(req.id)
        start, count, reason = self.clock(), 0, None
        async with aclosing(self.clients[worker_id].stream(body)) as chunks:
            async for chunk in chunks:
                if chunk.cached_tokens is not None:
                    if move is None:
                        self._prefix_hit(req, worker_id, chunk.cached_tokens)
                    continue
                now = self.clock()
                if move is not None and count == 0 and chunk.token_ids:
                    self._landed(move, now - start)
                count += len(chunk.token_ids)
                stopped = self._emit(req, chunk.token_ids)
                reason = "stop" if stopped else chunk.finish_reason
                ended = [req.id] if reason is not None else []
                self._carry_out(self.cluster.observe(worker_id, now, {req.id: count}, ended).effects)
                if stopped:
                    break  # closing the stream aborts the rest of it in vLLM
        if reason is None:
            self._carry_out(self.cluster.observe(worker_id, self.clock(), {req.id: count}, [req.id]).effects)
        self._finish(req, reason or "length")

    def _prefix_hit(self, req: Request, worker_id: int, cached: int | None) -> None:
        """The prompt tokens the instance that computed ``req``'s prompt found in its prefix cache
        (None: it does not say) become the client's ``cached_tokens`` in place of the mirror's
        prediction, and count in that instance's prefix-cache metrics. The mirror's cache needs
        no change: right or wrong, the instance now holds every block of the prompt, as the
        mirror stored them at its first token."""
        if cached is None:
            return
        if cached != req.cached:
            log.debug("vLLM instance %d found %d of request %d's %d prompt tokens cached; its mirror "
                      "predicted %d", worker_id, cached, req.id, req.prompt_len, req.cached)
        req.cached = cached
        self.metrics.record_prefix_cache(worker_id, req.prompt_len, cached)

    def _emit(self, req: Request, tokens: list[int]) -> bool:
        """Send ``tokens`` to the client; True if a stop string ended its stream."""
        return any(self.inflight.stream({req.id: token}, []) for token in tokens)

    def _finish(self, req: Request, reason: str) -> None:
        """The instance ended the stream: so does the client's (unless a stop string did)."""
        self._handoffs.pop(req.id, None)
        self.inflight.stream({}, [(req, "eos" if reason == "stop" else "length")])

    def _landed(self, move: Migrate, seconds: float) -> None:
        """The decode instance's first token: the hand-off (KV pull plus one step) is done."""
        move.request.migration_time = seconds
        self.metrics.record_migration(seconds, move.request.prompt_len)
        self._carry_out(self.cluster.migrated(move.request, move.source, move.target))

    def _failed(self, req: Request, move: Migrate | None, reason: str) -> None:
        """The instance answered with an error: a hand-off that broke before it landed frees both
        sides and fails the request (503); any other error fails it (500)."""
        landing = move is not None and req.decode_worker != move.target
        if move is not None and landing and self.cluster.where(req.id) == move.target:
            self._carry_out(self.cluster.migration_failed(req, move.source, move.target,
                                                          f"KV hand-off failed: {reason}"))
        else:
            self._fail(req.id, reason)

    def _died(self, worker_id: int) -> None:
        """Bring the dead instance back."""
        self._spawn(self._revive(worker_id), f"revive-{worker_id}")

    async def _revive(self, worker_id: int) -> None:
        """Restart the instance (the same launch: role, port, cores) until it answers, then give
        the Cluster a fresh mirror of it."""
        instance = self.clients[worker_id]
        while not instance.alive:
            try:
                await instance.restart(self.start_timeout)
            except (RuntimeError, TimeoutError, OSError) as exc:
                log.warning("vLLM instance %d did not come back (%s); trying again", worker_id, exc)
                await asyncio.sleep(RESTART_PAUSE_S)
        self._revived(worker_id)

    async def _watch(self) -> None:
        """Probe live instances, so a death is noticed even with nothing in flight there."""
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            await asyncio.gather(*(c.probe() for c in self.clients if c.alive))

    def _spawn(self, work: Any, name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _body(self, req: Request) -> dict[str, Any]:
        sub = self.inflight.handles[req.id].submission
        body: dict[str, Any] = {"prompt": sub.prompt_ids, "max_tokens": sub.max_tokens,
                                "temperature": sub.params.temperature, "top_p": sub.params.top_p,
                                "ignore_eos": sub.ignore_eos}
        if sub.params.top_k:
            body["top_k"] = sub.params.top_k
        if sub.params.seed is not None:
            body["seed"] = sub.params.seed
        return body | sampling_controls(sub.params)


def sampling_controls(params: SamplingParams) -> dict[str, Any]:
    """The sampling controls vLLM applies itself, in its request's terms (those set)."""
    controls = {"presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty,
                "min_tokens": params.min_tokens, "logit_bias": {str(t): b for t, b in params.logit_bias}}
    if params.repetition_penalty != 1:
        controls["repetition_penalty"] = params.repetition_penalty
    return {name: value for name, value in controls.items() if value}


def unsupported_over_vllm(submission: Submission) -> str | None:
    """The first field of ``submission`` whose result the router cannot carry back from vLLM
    (it reads token ids only): logprobs, a prompt's logprobs, stop token ids (their text must
    go), a response format (its grammar runs here, not there)."""
    params = submission.params
    named = [("logprobs", params.logprobs is not None),
             ("echo with logprobs", params.prompt_logprobs is not None),
             ("stop_token_ids", bool(params.stop_token_ids)),
             ("response_format", submission.constraint is not None)]
    return next((name for name, asked in named if asked), None)
