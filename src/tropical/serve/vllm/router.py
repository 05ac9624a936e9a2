"""The router over vLLM instances: the same policy objects as the simulator, deciding on shadows.

Each request runs as one task. Path 1 (a prefill instance): the prompt with ``max_tokens: 1`` and
``kv_transfer_params: {"do_remote_decode": true}``; the policy then picks the decode instance,
which gets the same request with the ``kv_transfer_params`` the prefill returned and pulls the KV
through vLLM's connector (NIXL) instead of recomputing it; its stream is the client's. Path 2
(a multiplexing or colocated instance): the prompt goes straight there and prefills locally.
Every event updates that instance's Shadow, which the policy reads (``workers``).

A request whose instance dies before it streamed anything runs again (unless it asked not to);
one that had streamed ends with an error saying so; the dead instance leaves the policy's view.
The HTTP layer sees the same surface as ``serve.router.Router``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from contextlib import aclosing
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from tropical.core.latency.model import LatencyModel
from tropical.core.request import Request
from tropical.sched.admission import NO_LIVE_WORKER, admission_error, serving_error
from tropical.sched.policy import Assignment, Policy, apply
from tropical.sched.rules import Role
from tropical.sched.worker import WorkerState
from tropical.serve.metrics import ServerMetrics
from tropical.serve.router import SHUTTING_DOWN, Rejected, RouterSettings, check_capacity
from tropical.serve.streams import RequestHandle, Submission
from tropical.serve.vllm.instance import InstanceDied, InstanceError, VllmInstance
from tropical.serve.vllm.shadow import Shadow

if TYPE_CHECKING:  # the tokenizer's module loads torch (GGUF vocabularies); the router does not
    from tropical.engine.tokenizer import Tokenizer

REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}
PROBE_INTERVAL_S = 1.0
ROOM_POLL_S = 0.05


class VllmRouter:
    """Shadows of the instances, the instances, and the policy that routes requests across them."""

    def __init__(self, policy: Policy, shadows: Sequence[Shadow], instances: Sequence[VllmInstance],
                 tokenizer: Tokenizer, reference: LatencyModel, settings: RouterSettings,
                 metrics: ServerMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.shadows = list(shadows)
        self.workers: list[WorkerState] = [s.state for s in self.shadows]
        self.clients = list(instances)
        self.tokenizer = tokenizer
        self.reference = reference
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.handles: dict[int, RequestHandle] = {}
        self.draining = False
        self._ids = itertools.count()
        self._tasks: dict[int, asyncio.Task] = {}
        self._where: dict[int, int] = {}
        self._watcher: asyncio.Task | None = None
        for i, instance in enumerate(self.clients):
            instance.on_death = partial(self._instance_died, i)

    def start(self) -> None:
        self._watcher = asyncio.create_task(self._watch(), name="vllm-watch")
        for worker in self.workers:
            self._report(worker)

    async def stop(self) -> None:
        tasks = [*self._tasks.values(), *([self._watcher] if self._watcher else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for instance in self.clients:
            await instance.close()

    async def drain(self, timeout: float) -> None:
        """Stop taking requests and wait (up to ``timeout``) for those in flight to finish."""
        self.draining = True
        deadline = self.clock() + timeout
        while self.handles and self.clock() < deadline:
            await asyncio.sleep(0.05)

    @property
    def unavailable(self) -> str | None:
        """Why no new request could be served now (for /health), or None when one could."""
        return SHUTTING_DOWN if self.draining else serving_error(self.workers)

    def submit(self, submission: Submission) -> RequestHandle:
        """Admit a request and let the policy place its prefill; raises Rejected."""
        self._check_capacity()
        now = self.clock()
        req = Request(next(self._ids), now, len(submission.prompt_ids), submission.max_tokens,
                      submission.slo(self.settings.slo, self.reference))
        error = admission_error(req, self.workers, self.settings.max_context)
        if error is not None:
            raise Rejected(503 if error.startswith(NO_LIVE_WORKER) else 400, error)
        handle = RequestHandle.of(req, submission, self.tokenizer)
        self.handles[req.id] = handle
        self._assign(self.policy.on_arrival(req, now, self.workers))
        return handle

    def abort(self, rid: int) -> None:
        """The client went away: cancelling its task closes its vLLM connection, which aborts it there."""
        handle = self.handles.pop(rid, None)
        if handle is None:
            return
        handle.ended = True
        self.metrics.record_request("aborted")
        task = self._tasks.pop(rid, None)
        if task is not None:
            task.cancel()
        self._leave(handle.req)

    def _check_capacity(self) -> None:
        check_capacity(self.draining, any(c.alive for c in self.clients), self.workers, self.settings,
                       self.metrics, "no vLLM instance is running")

    def _assign(self, assignments: list[Assignment]) -> None:
        """Start (or move) each request's task on the instance its assignment names."""
        for a in assignments:
            rid = a.request.id
            if a.from_worker is not None:
                self._cancel_task(rid)
                self.shadows[a.from_worker].prefill_since.pop(rid, None)
            apply(a, self.workers)
            self.metrics.record_path(a.path.value)
            self._where[rid] = a.worker_id
            self._tasks[rid] = asyncio.create_task(self._run(a.request, a.worker_id), name=f"request-{rid}")

    def _cancel_task(self, rid: int) -> None:
        task = self._tasks.pop(rid, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _run(self, req: Request, worker_id: int) -> None:
        """One request from its instance's first byte to its last, failures included."""
        try:
            if self.workers[worker_id].role is Role.PREFILL:
                await self._path1(req, worker_id)
            else:
                await self._stream(req, worker_id, self._body(req), self._prefilled_here)
        except InstanceDied as exc:
            self._lost(req, str(exc))
        except InstanceError as exc:
            self._fail(req, str(exc))
        finally:
            if self._tasks.get(req.id) is asyncio.current_task():
                del self._tasks[req.id]

    async def _path1(self, req: Request, prefill_id: int) -> None:
        """Prefill there, then hand the KV off to the decode instance the policy picks."""
        shadow = self.shadows[prefill_id]
        shadow.sent(req, self.clock())
        reply = await self.clients[prefill_id].complete({**self._body(req), "max_tokens": 1,
                                                         "kv_transfer_params": REMOTE_DECODE})
        now = self.clock()
        shadow.prefilled(req, now)
        self._after_event(prefill_id, now)
        params = reply.get("kv_transfer_params")
        if req.output_len == 1 or params is None:
            self._answer_from_prefill(req, prefill_id, reply, params is None)
            return
        target = await self._decode_instance(req)
        if target is None:
            self.shadows[prefill_id].dropped(req, self.clock())
            self._fail(req, "no live instance is left to decode it")
            return
        self.shadows[target].expect(req)
        shadow.dropped(req, self.clock())
        self._where[req.id] = target
        body = {**self._body(req), "kv_transfer_params": params}
        await self._stream(req, target, body, partial(self._landed, start=self.clock()))

    def _answer_from_prefill(self, req: Request, prefill_id: int, reply: dict[str, Any],
                             no_handoff: bool) -> None:
        """A one-token answer needs no hand-off; a prefill with no KV connector cannot give one."""
        self.shadows[prefill_id].dropped(req, self.clock())
        handle = self.handles.get(req.id)
        if handle is None:
            return
        if no_handoff and req.output_len > 1:
            self._fail(req, f"prefill instance {prefill_id} returned no kv_transfer_params; "
                            f"was it started with a KV connector (--kv-transfer-config)?")
            return
        choice = reply["choices"][0]
        handle.emit(list(choice.get("token_ids") or []))
        self._finish(req, choice.get("finish_reason") or "length")

    async def _decode_instance(self, req: Request) -> int | None:
        """The policy's decode instance for a prefilled request, waiting while none has room."""
        while req.id in self.handles:
            target = self.policy.decode_worker(req, self.workers, self.clock())
            if target is not None:
                return target.id
            if not any(w.alive and w.role.decodes for w in self.workers):
                return None
            await asyncio.sleep(ROOM_POLL_S)
        return None

    async def _stream(self, req: Request, worker_id: int, body: dict[str, Any],
                      first: Callable[[Request, int, float], None]) -> None:
        """Stream the instance's tokens to the client, keeping its shadow in step."""
        shadow, handle = self.shadows[worker_id], self.handles.get(req.id)
        if handle is None:
            return
        if req.id not in shadow.state.incoming:
            shadow.sent(req, self.clock())
        async with aclosing(self.clients[worker_id].stream(body)) as chunks:
            async for chunk in chunks:
                now = self.clock()
                if handle.completion_tokens == 0 and chunk.token_ids:
                    first(req, worker_id, now)
                    req.first_token = now
                stopped = handle.emit(chunk.token_ids) if chunk.token_ids else False
                shadow.decoded(req, handle.completion_tokens, now)
                self._after_event(worker_id, now)
                reason = "stop" if stopped else chunk.finish_reason
                if reason is not None:
                    self._finish(req, reason)
                    return
        self._finish(req, "length")

    def _prefilled_here(self, req: Request, worker_id: int, now: float) -> None:
        self.shadows[worker_id].prefilled(req, now)

    def _landed(self, req: Request, worker_id: int, now: float, start: float) -> None:
        """The decode instance's first token: the hand-off (KV pull plus one step) is done."""
        self.shadows[worker_id].landed(req, now)
        req.migration_time = now - start
        self.metrics.record_migration(req.migration_time, req.prompt_len)

    def _after_event(self, worker_id: int, now: float) -> None:
        """An observed iteration end: the policy may look (the toggle revisits its queue)."""
        self._report(self.workers[worker_id])
        if self.policy.observes_iterations:
            self._assign(self.policy.on_iteration_end(self.workers[worker_id], now, self.workers))

    def _finish(self, req: Request, reason: str) -> None:
        """End the stream and record the request as it really ran."""
        handle = self.handles.pop(req.id, None)
        self._leave(req)
        if handle is None:
            return
        tokens = max(1, handle.completion_tokens)
        handle.end(reason)
        self.metrics.observe_finished(replace(handle.req, output_len=tokens, generated=tokens,
                                              finish=self.clock()))
        self.metrics.record_request("finished")

    def _leave(self, req: Request) -> None:
        """Drop ``req`` from the shadow of the instance it is on."""
        worker_id = self._where.pop(req.id, None)
        if worker_id is not None:
            self.shadows[worker_id].dropped(req, self.clock())
            self._report(self.workers[worker_id])

    def _fail(self, req: Request, reason: str) -> None:
        self._leave(req)
        handle = self.handles.pop(req.id, None)
        if handle is None:
            return
        handle.req.fail(self.clock(), reason)
        handle.end(error=reason)
        self.metrics.record_request("failed")

    def _lost(self, req: Request, reason: str) -> None:
        """Its instance died: run it again from its prompt if nothing was streamed yet."""
        handle = self.handles.get(req.id)
        if handle is None:
            return
        if handle.completion_tokens or not handle.submission.retry:
            why = "after this request had started streaming" if handle.completion_tokens else (
                "and this request asked not to be retried")
            self._fail(req, f"its vLLM instance died {why} ({reason})")
            return
        self._leave(req)
        fresh = Request(req.id, req.arrival, req.prompt_len, req.output_len, req.slo)
        error = admission_error(fresh, self.workers, self.settings.max_context)
        if error is not None:
            self._fail(req, f"its vLLM instance died and no live instance can run it: {error}")
            return
        handle.req = fresh
        self.metrics.record_request("rerun")
        self._assign(self.policy.on_arrival(fresh, self.clock(), self.workers))

    def _instance_died(self, worker_id: int) -> None:
        """Take the instance out of the policy's view; its requests' tasks see their connections
        fail and rerun or fail one by one."""
        worker = self.workers[worker_id]
        worker.alive = False
        self._report(worker)

    async def _watch(self) -> None:
        """Probe live instances, so a death is noticed even with nothing in flight there."""
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            await asyncio.gather(*(c.probe() for c in self.clients if c.alive))

    def _body(self, req: Request) -> dict[str, Any]:
        sub = self.handles[req.id].submission
        body: dict[str, Any] = {"prompt": sub.prompt_ids, "max_tokens": sub.max_tokens,
                                "temperature": sub.params.temperature, "top_p": sub.params.top_p,
                                "ignore_eos": sub.ignore_eos}
        if sub.params.top_k:
            body["top_k"] = sub.params.top_k
        if sub.params.seed is not None:
            body["seed"] = sub.params.seed
        return body

    def _report(self, worker: WorkerState) -> None:
        used = worker.kv.used_blocks / worker.kv.capacity_blocks if worker.kv.capacity_blocks else 0.0
        self.metrics.set_worker(worker.id, worker.role.value, len(worker.running), len(worker.waiting),
                                used, alive=worker.alive, node=self.clients[worker.id].node)
