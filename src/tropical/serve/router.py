"""The router's cluster: the same policy object and per-worker batch formation as the simulator,
driven by a real clock and real worker processes.

Each worker has a driver task: plan a step (sched's ``form_batch`` on this router's copy of the
worker's state), send it, book the sampled tokens as the simulator books an iteration, stream
them, then let the policy look (iteration ends, migrations). Aborts and finished requests free
KV in the worker's next command. A worker that dies fails its requests and leaves the policy's
view (``alive``); the others keep serving. A worker its backend restarts (Ray) comes back with
an empty KV cache: a fresh state under its old role, a new planner and driver (``revive``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tropical.core.latency.model import LatencyModel
from tropical.core.request import Request
from tropical.core.slo import SLO, SLOSpec
from tropical.engine.planner import Booked, StepPlanner
from tropical.engine.planner import Sequence as EngineSequence
from tropical.engine.runner import worker_state
from tropical.engine.tokenizer import Tokenizer
from tropical.sched.admission import NO_LIVE_WORKER, admission_error
from tropical.sched.policy import Assignment, Policy, apply
from tropical.sched.worker import WorkerState
from tropical.serve.messages import Free, Step, StepDone
from tropical.serve.metrics import ServerMetrics
from tropical.serve.streams import RequestHandle, Submission
from tropical.serve.worker_handle import WorkerDied, WorkerError, WorkerHandle


class Rejected(Exception):
    """The router will not take a request now; ``status`` is 429 (overloaded) or 503 (unavailable)
    or 400 (it can never run here)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass(frozen=True, slots=True)
class RouterSettings:
    """Limits and defaults: ``max_waiting`` requests may queue before 429s; ``slo`` prices
    requests that name no SLO of their own."""

    max_waiting: int = 256
    slo: SLOSpec = SLOSpec()
    max_context: int | None = None


class Router:
    """Workers' states, their planners and processes, and the policy that assigns requests."""

    def __init__(self, policy: Policy, workers: Sequence[WorkerState], clients: Sequence[WorkerHandle],
                 tokenizer: Tokenizer, reference: LatencyModel,
                 settings: RouterSettings, metrics: ServerMetrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.workers = list(workers)
        self.clients = list(clients)
        self.eos = frozenset(tokenizer.eos_token_ids)
        self.planners = [StepPlanner(w, self.eos) for w in self.workers]
        self.tokenizer = tokenizer
        self.reference = reference
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.handles: dict[int, RequestHandle] = {}
        self._ids = itertools.count()
        self._where: dict[int, int] = {}
        self._aborts: list[set[int]] = [set() for _ in self.workers]
        self._frees: list[list[int]] = [[] for _ in self.workers]
        self._wakeups = [asyncio.Event() for _ in self.workers]
        self._stalled: list[tuple[Request, int]] = []
        self._tasks: list[asyncio.Task] = []
        self.draining = False
        for client in self.clients:
            client.on_death = self._worker_died
            client.on_revive = self.revive

    def start(self) -> None:
        self._tasks = [self._driver(w.id) for w in self.workers]
        for worker in self.workers:
            self._report(worker)

    def _driver(self, worker_id: int) -> asyncio.Task:
        return asyncio.create_task(self._drive(worker_id), name=f"drive-{worker_id}")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def in_flight(self) -> int:
        return len(self.handles)

    def slo_of(self, submission: Submission) -> SLO:
        return submission.slo(self.settings.slo, self.reference)

    def submit(self, submission: Submission) -> RequestHandle:
        """Admit a request and let the policy place its prefill; raises Rejected."""
        self._check_capacity()
        now = self.clock()
        req = Request(next(self._ids), now, len(submission.prompt_ids), submission.max_tokens,
                      self.slo_of(submission))
        error = admission_error(req, self.workers, self.settings.max_context)
        if error is not None:
            raise Rejected(503 if error.startswith(NO_LIVE_WORKER) else 400, error)
        handle = RequestHandle.of(req, submission, self.tokenizer)
        self.handles[req.id] = handle
        self._place(req, submission, now)
        return handle

    def _place(self, req: Request, submission: Submission, now: float) -> None:
        """Let the policy place a (new or re-run) request's prefill, with its tokens."""
        seq = EngineSequence(req, list(submission.prompt_ids), submission.params, submission.ignore_eos)
        self._assign(self.policy.on_arrival(req, now, self.workers), {req.id: seq})

    def _check_capacity(self) -> None:
        if self.draining:
            raise Rejected(503, "the server is shutting down")
        if not any(c.alive for c in self.clients):
            raise Rejected(503, "no worker is running")
        waiting = sum(len(w.waiting) for w in self.workers if w.alive)
        if waiting >= self.settings.max_waiting:
            self.metrics.record_rejection("queue_full")
            raise Rejected(429, f"server overloaded: {waiting} requests waiting "
                                f"(limit {self.settings.max_waiting}); retry later")

    def _assign(self, assignments: list[Assignment], new: dict[int, EngineSequence] | None = None) -> None:
        """Move each request (and its tokens) to its worker, then wake the workers together."""
        woken = set()
        for a in assignments:
            rid = a.request.id
            seq = (new or {}).get(rid) or self.planners[a.from_worker].sequences.pop(rid)
            apply(a, self.workers)
            self.planners[a.worker_id].add(seq)
            self._where[rid] = a.worker_id
            self.metrics.record_path(a.path.value)
            woken.add(a.worker_id)
        for worker_id in woken:
            self._wake(worker_id)

    def _wake(self, worker_id: int) -> None:
        self._wakeups[worker_id].set()

    def abort(self, rid: int) -> None:
        """The client went away: stop generating and free the request's KV at the next boundary."""
        handle = self.handles.pop(rid, None)
        if handle is None:
            return
        handle.ended = True
        self.metrics.record_request("aborted")
        worker_id = self._where.get(rid)
        if worker_id is not None:
            self._aborts[worker_id].add(rid)
            self._wake(worker_id)

    async def _drive(self, worker_id: int) -> None:
        """Run this worker's iterations back to back while it has work; sleep otherwise."""
        wakeup, client = self._wakeups[worker_id], self.clients[worker_id]
        while client.alive:
            await wakeup.wait()
            wakeup.clear()
            while client.alive and await self._step(worker_id):
                pass

    async def _step(self, worker_id: int) -> bool:
        """One iteration; False when the worker has nothing to run."""
        worker, planner = self.workers[worker_id], self.planners[worker_id]
        self._apply_aborts(worker_id)
        start = self.clock()
        planned = planner.plan(start)
        frees, self._frees[worker_id] = self._frees[worker_id], []
        if planned is None:
            if frees:
                await self._call(worker_id, Free(frees))
            self._report(worker)
            return False
        for req, _, _ in planned.batch.prefills:
            req.prefill_start = start if req.prefill_start is None else req.prefill_start
        predicted = worker.latency.iteration_time(planned.batch.shape)
        worker.busy_until = start + predicted
        done: StepDone | None = await self._call(worker_id, Step(planned.spec, frees))
        if done is None:
            return False
        end = self.clock()
        worker.busy_until = end
        booked = planner.book(planned, done.tokens, end)
        self._after(worker_id, booked, end)
        self.metrics.record_iteration(worker_id, self.clock() - start, done.seconds, predicted)
        if booked.prefilled:
            # Let the migrations just started send their exports now, so they run at this boundary
            # instead of waiting behind the worker's next iteration (the simulator moves KV at once).
            await asyncio.sleep(0)
        return True

    async def _call(self, worker_id: int, command: object) -> object | None:
        """A command to a worker; None if the worker died (its requests are failed elsewhere)."""
        try:
            return await self.clients[worker_id].call(command)
        except WorkerDied:
            return None

    def _apply_aborts(self, worker_id: int) -> None:
        aborts, self._aborts[worker_id] = self._aborts[worker_id], set()
        for rid in aborts:
            self._drop(worker_id, rid)

    def _drop(self, worker_id: int, rid: int) -> None:
        """Forget ``rid`` on ``worker_id`` (between iterations) and free its KV there."""
        if self.planners[worker_id].remove(rid) is not None:
            self._frees[worker_id].append(rid)
        self._where.pop(rid, None)

    def _after(self, worker_id: int, booked: Booked, now: float) -> None:
        """Stream the step's tokens, finish and migrate what it completed, let the policy look."""
        for rid, token in booked.tokens.items():
            handle = self.handles.get(rid)
            if handle is not None and handle.emit([token]):
                self._finish(handle, "stop")
                self._aborts[worker_id].add(rid)
        for finished in booked.finished:
            self._frees[worker_id].append(finished.req.id)
            self._where.pop(finished.req.id, None)
            handle = self.handles.get(finished.req.id)
            if handle is not None:
                self._finish(handle, "stop" if finished.reason == "eos" else "length")
        if booked.finished:
            self._retry_stalled()
        for req in booked.prefilled:
            if req.id in self.handles:
                asyncio.create_task(self._migrate(req, worker_id))
        if self.policy.observes_iterations:
            self._assign(self.policy.on_iteration_end(self.workers[worker_id], now, self.workers))
        self._report(self.workers[worker_id])

    def _finish(self, handle: RequestHandle, reason: str) -> None:
        """End the stream and record the request's latencies as it really ran: a stop (string or
        eos) ends it before ``output_len``, which the scheduler's copy must keep until dropped."""
        req = self.handles.pop(handle.req.id).req
        tokens = max(1, handle.completion_tokens)
        finish = req.finish if req.finish is not None else self.clock()
        handle.end(reason)
        self.metrics.observe_finished(replace(req, output_len=tokens, generated=tokens, finish=finish))
        self.metrics.record_request("finished")

    async def _migrate(self, req: Request, source_id: int) -> None:
        """Move a prefilled request's KV to the decoding worker the policy picks, then decode there."""
        target = self.policy.decode_worker(req, self.workers, self.clock())
        if target is None:
            self._stall(req, source_id)
            return
        target.expect_migration(req)
        self._where[req.id] = target.id
        start = self.clock()
        try:
            async with self.clients[source_id].exported(req.id, req.prompt_len) as blob:
                await self.clients[target.id].import_kv(req.id, blob, req.prompt_len)
        except (WorkerDied, WorkerError) as exc:
            self._migration_failed(req, source_id, target, exc)
            return
        req.migration_time = self.clock() - start
        self.metrics.record_migration(req.migration_time, req.prompt_len)
        seq = self.planners[source_id].remove(req.id)
        self._frees[source_id].append(req.id)
        self._wake(source_id)
        if req.id not in self.handles:
            self._unexpect(target, req)
            return
        self.planners[target.id].add(seq)
        target.arrive_migrated(req)
        self._wake(target.id)

    def _unexpect(self, target: WorkerState, req: Request) -> None:
        """Cancel a migration into ``target``: its reservation, and any KV already imported."""
        target.release(req)
        target.incoming.pop(req.id, None)
        self._frees[target.id].append(req.id)
        self._wake(target.id)

    def _migration_failed(self, req: Request, source_id: int, target: WorkerState, exc: Exception) -> None:
        self._unexpect(target, req)
        self._drop(source_id, req.id)
        self._wake(source_id)
        self._fail(req.id, f"KV migration failed: {exc}")

    def _stall(self, req: Request, source_id: int) -> None:
        """Wait for room on a decoding worker; with none alive, waiting could last forever."""
        if any(w.alive and w.role.decodes for w in self.workers):
            self._stalled.append((req, source_id))
            return
        self._drop(source_id, req.id)
        self._wake(source_id)
        self._fail(req.id, "no live worker is left to decode it")

    def _retry_stalled(self) -> None:
        stalled, self._stalled = self._stalled, []
        for req, source_id in stalled:
            if req.id in self.handles:
                asyncio.create_task(self._migrate(req, source_id))

    def _fail(self, rid: int, reason: str) -> None:
        handle = self.handles.pop(rid, None)
        if handle is None:
            return
        handle.req.fail(self.clock(), reason)
        handle.end(error=reason)
        self.metrics.record_request("failed")

    def _worker_died(self, worker_id: int) -> None:
        """Take the dead worker out of the policy's view and keep serving: requests that have
        streamed nothing yet start over elsewhere (unless they asked not to), the rest end with a
        clear error."""
        worker = self.workers[worker_id]
        worker.alive = False
        lost = [*self.planners[worker_id].sequences, *worker.incoming]
        for rid in lost:
            self._where.pop(rid, None)
            handle = self.handles.get(rid)
            if handle is not None and handle.completion_tokens == 0 and handle.submission.retry:
                self._rerun(handle)
            elif handle is not None:
                self._fail(rid, self._death_note(worker_id, handle))
        self.metrics.set_worker(worker_id, worker.role.value, 0, 0, 0.0, alive=False,
                                node=self.clients[worker_id].node)
        self._retry_stalled()

    def _death_note(self, worker_id: int, handle: RequestHandle) -> str:
        why = ("after this request had started streaming" if handle.completion_tokens
               else "and this request asked not to be retried")
        return f"worker {worker_id} (pid {self.clients[worker_id].pid}) died {why}"

    def revive(self, worker_id: int) -> None:
        """A restarted worker serves again: a fresh state (empty KV pool) with the old role, rules,
        latency and cache size, a new planner, and a new driver in place of the dead one's."""
        old = self.workers[worker_id]
        worker = worker_state(worker_id, old.role, old.rules, old.kv.capacity_blocks, old.kv.block_size,
                              old.latency)
        self.workers[worker_id] = worker
        self.planners[worker_id] = StepPlanner(worker, self.eos)
        self._aborts[worker_id], self._frees[worker_id] = set(), []
        self._tasks[worker_id].cancel()
        self._tasks[worker_id] = self._driver(worker_id)
        self.metrics.record_revival(worker_id)
        self._report(worker)
        self._retry_stalled()

    def _rerun(self, handle: RequestHandle) -> None:
        """Submit ``handle``'s request again from its prompt, as a fresh arrival at its old time."""
        old, sub = handle.req, handle.submission
        req = Request(old.id, old.arrival, old.prompt_len, old.output_len, old.slo)
        error = admission_error(req, self.workers, self.settings.max_context)
        if error is not None:
            self._fail(req.id, f"its worker died and no live worker can run it: {error}")
            return
        handle.req = req
        self.metrics.record_request("rerun")
        self._place(req, sub, self.clock())

    def _report(self, worker: WorkerState) -> None:
        used = worker.kv.used_blocks / worker.kv.capacity_blocks if worker.kv.capacity_blocks else 0.0
        self.metrics.set_worker(worker.id, worker.role.value, len(worker.running), len(worker.waiting),
                                used, alive=worker.alive, node=self.clients[worker.id].node)

    async def drain(self, timeout: float) -> None:
        """Stop taking requests and wait (up to ``timeout``) for those in flight to finish."""
        self.draining = True
        deadline = self.clock() + timeout
        while self.handles and self.clock() < deadline:
            await asyncio.sleep(0.05)
