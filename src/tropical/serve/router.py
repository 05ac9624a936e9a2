"""The router: asyncio, HTTP streams and worker handles around sched's ``Cluster``.

The Cluster decides (the same one the simulator drives); the router carries out its effects on
real worker processes. Each worker has a driver task: plan a step (``Cluster.plan``), send it with
the request tokens (``sched.step``), book the sampled tokens (``Cluster.book``), stream them, then
do what the booking asks: migrate KV, free KV, wake workers. Aborts are applied between the
iterations of the worker holding the request. A worker that dies fails or re-runs its requests and
leaves the policy's view; one its backend restarts (Ray) comes back with an empty KV cache
(``revive``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

from tropical.core.latency.model import LatencyModel
from tropical.core.request import Request
from tropical.core.slo import SLO, SLOSpec
from tropical.sched.admission import NO_LIVE_WORKER, serving_error
from tropical.sched.batching import Batch
from tropical.sched.cluster import Assigned, Cluster, Effect, Fail, Free, Migrate, Wake
from tropical.sched.policy import Policy
from tropical.sched.step import TokenSequence, record_tokens, step_spec
from tropical.sched.worker import WorkerState
from tropical.serve.iteration_log import IterationLog, IterationRecord, MigrationRecord
from tropical.serve.metrics import ServerMetrics
from tropical.serve.streams import RequestHandle, Submission
from tropical.serve.workers.handle import WorkerDied, WorkerError, WorkerHandle
from tropical.serve.workers.messages import Free as FreeKV
from tropical.serve.workers.messages import Step, StepDone

if TYPE_CHECKING:  # the tokenizer's module loads torch (GGUF vocabularies); the router does not
    from tropical.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)
SHUTTING_DOWN = "the server is shutting down"


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


def check_capacity(draining: bool, running: bool, workers: Sequence[WorkerState], settings: RouterSettings,
                   metrics: ServerMetrics, nothing_runs: str) -> None:
    """Refuse a new request while draining (503), with no worker process running (503, saying
    ``nothing_runs``) or past ``max_waiting`` queued requests (429); both routers ask this."""
    if draining:
        raise Rejected(503, SHUTTING_DOWN)
    if not running:
        raise Rejected(503, nothing_runs)
    waiting = sum(len(w.waiting) for w in workers if w.alive)
    if waiting >= settings.max_waiting:
        metrics.record_rejection("queue_full")
        raise Rejected(429, f"server overloaded: {waiting} requests waiting "
                            f"(limit {settings.max_waiting}); retry later")


@dataclass(slots=True)
class Landing:
    """A migration whose KV is staged on its source, waiting for its target's next boundary;
    ``done`` releases the staged copy once the target has imported it (or failed to)."""

    move: Migrate
    blob: object
    staged: float
    exported: float
    done: asyncio.Future

    def release(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


class Router:
    """The Cluster, the worker processes it runs on, and the streams of the requests in flight."""

    def __init__(self, policy: Policy, workers: Sequence[WorkerState], clients: Sequence[WorkerHandle],
                 tokenizer: Tokenizer, reference: LatencyModel,
                 settings: RouterSettings, metrics: ServerMetrics,
                 clock: Callable[[], float] = time.monotonic,
                 iteration_log: IterationLog | None = None) -> None:
        self.cluster = Cluster(workers, policy, settings.max_context)
        self.clients = list(clients)
        self.eos = frozenset(tokenizer.eos_token_ids)
        self.tokenizer = tokenizer
        self.reference = reference
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.iteration_log = iteration_log
        self.handles: dict[int, RequestHandle] = {}
        self.sequences: dict[int, TokenSequence] = {}
        self._ids = itertools.count()
        self._aborts: list[set[int]] = [set() for _ in self.workers]
        self._frees: list[list[int]] = [[] for _ in self.workers]
        self._wakeups = [asyncio.Event() for _ in self.workers]
        self._landings: list[list[Landing]] = [[] for _ in self.workers]
        self._tasks: list[asyncio.Task] = []
        self.draining = False
        for client in self.clients:
            client.on_death = self._worker_died
            client.on_revive = self.revive

    @property
    def workers(self) -> list[WorkerState]:
        return self.cluster.workers

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

    def slo_of(self, submission: Submission) -> SLO:
        return submission.slo(self.settings.slo, self.reference)

    def submit(self, submission: Submission) -> RequestHandle:
        """Admit a request and let the policy place its prefill; raises Rejected."""
        self._check_capacity()
        now = self.clock()
        req = Request(next(self._ids), now, len(submission.prompt_ids), submission.max_tokens,
                      self.slo_of(submission))
        effects = self.cluster.arrive(req, now)
        refused = next((e.reason for e in effects if isinstance(e, Fail)), None)
        if refused is not None:
            raise Rejected(503 if refused.startswith(NO_LIVE_WORKER) else 400, refused)
        handle = RequestHandle.of(req, submission, self.tokenizer)
        self.handles[req.id] = handle
        self._track(req, submission)
        self._carry_out(effects)
        return handle

    def _track(self, req: Request, submission: Submission) -> None:
        self.sequences[req.id] = TokenSequence(req, list(submission.prompt_ids), submission.params,
                                               submission.ignore_eos)

    def _check_capacity(self) -> None:
        check_capacity(self.draining, any(c.alive for c in self.clients), self.workers, self.settings,
                       self.metrics, "no worker is running")

    def _carry_out(self, effects: list[Effect]) -> None:
        """Do what the cluster asks, on the worker processes and the streams."""
        for effect in effects:
            if isinstance(effect, Assigned):
                self.metrics.record_path(effect.request.path.value)
            elif isinstance(effect, Wake):
                self._wakeups[effect.worker_id].set()
            elif isinstance(effect, Migrate):
                asyncio.create_task(self._migrate(effect))
            elif isinstance(effect, Free):
                self._frees[effect.worker_id].append(effect.request_id)
            elif isinstance(effect, Fail):
                self._fail(effect.request, effect.reason)

    def abort(self, rid: int) -> None:
        """The client went away: stop generating and free the request's KV at the next boundary."""
        handle = self.handles.pop(rid, None)
        if handle is None:
            return
        handle.ended = True
        self.metrics.record_request("aborted")
        self._abort_on(self.cluster.where(rid), rid)

    def _abort_on(self, worker_id: int | None, rid: int) -> None:
        if worker_id is not None:
            self._aborts[worker_id].add(rid)
            self._wakeups[worker_id].set()

    def _apply_aborts(self, worker_id: int) -> None:
        """Drop aborted requests held here (between iterations); one that moved since is dropped
        between the iterations of the worker it moved to."""
        aborts, self._aborts[worker_id] = self._aborts[worker_id], set()
        for rid in aborts:
            at = self.cluster.where(rid)
            if at != worker_id:
                self._abort_on(at, rid)
                continue
            self.sequences.pop(rid, None)
            self._carry_out(self.cluster.abort(rid, self.clock()))

    async def _drive(self, worker_id: int) -> None:
        """Run this worker's iterations back to back while it has work; sleep otherwise. A bug in
        a step must not end the driver silently (every later request would hang): it fails the
        worker's requests, which leaves its state clean, and the driver goes on."""
        wakeup, client = self._wakeups[worker_id], self.clients[worker_id]
        while client.alive:
            await wakeup.wait()
            wakeup.clear()
            try:
                while client.alive and await self._step(worker_id):
                    pass
            except Exception as exc:  # noqa: BLE001 - logged, and the worker's requests hear of it
                log.exception("worker %d's driver failed; failing its requests", worker_id)
                self._fail_requests([r.id for r in self.cluster.on_worker(worker_id)],
                                    f"internal error on worker {worker_id}: {exc!r}")

    async def _step(self, worker_id: int) -> bool:
        """One iteration; False when the worker has nothing to run."""
        self._apply_aborts(worker_id)
        await self._land(worker_id)
        worker = self.workers[worker_id]
        start = self.clock()
        batch = self.cluster.plan(worker_id, start)
        frees, self._frees[worker_id] = self._frees[worker_id], []
        if batch is None:
            if frees:
                await self._call(worker_id, FreeKV(frees))
            self._report(worker)
            return False
        spec = step_spec(batch, worker.running, self.sequences)
        predicted = worker.latency.iteration_time(batch.shape)
        self.cluster.expect_end(worker_id, start + predicted)
        try:
            done: StepDone = await self.clients[worker_id].call(Step(spec, frees))
        except WorkerDied:
            return False
        except WorkerError as exc:
            self.cluster.expect_end(worker_id, self.clock())
            self._fail_requests([cast(int, span.seq_id) for span in spec.spans],   # keyed by request id
                                f"the step running this request failed: {exc}")
            return True
        end = self.clock()
        eos = record_tokens(done.tokens, self.sequences, self.eos)
        booking = self.cluster.book(worker_id, batch, end, eos=eos)
        self._stream(worker_id, done.tokens, booking.finished)
        self._carry_out(booking.effects)
        self._report(worker)
        self._record_iteration(worker_id, batch, start, done.seconds, predicted)
        if any(isinstance(e, Migrate) for e in booking.effects):
            # Let the migrations just started send their exports now, so they run at this boundary
            # instead of waiting behind the worker's next iteration (the simulator moves KV at once).
            await asyncio.sleep(0)
        return True

    def _record_iteration(self, worker_id: int, batch: Batch, start: float, compute: float,
                          predicted: float) -> None:
        """An iteration's times into /metrics, and into the iteration log when there is one."""
        wall = self.clock() - start
        self.metrics.record_iteration(worker_id, wall, compute, predicted)
        self.metrics.record_prefill_chunks(sum(c + n < r.prompt_len for r, n, c in batch.prefills))
        if self.iteration_log is not None:
            self.iteration_log.write(IterationRecord(worker_id, start, batch.shape, wall, compute, predicted))

    async def _call(self, worker_id: int, command: object) -> object | None:
        """A command to a worker; None if the worker died (its requests are failed elsewhere)."""
        try:
            return await self.clients[worker_id].call(command)
        except WorkerDied:
            return None

    def _stream(self, worker_id: int, tokens: dict[int, int], finished: list[tuple[Request, str]]) -> None:
        """Send the step's tokens; end the streams of requests that finished or hit a stop string."""
        for rid, token in tokens.items():
            handle = self.handles.get(rid)
            if handle is not None and handle.emit([token]):
                self._finish(handle, "stop")
                self._abort_on(worker_id, rid)
        for req, reason in finished:
            self.sequences.pop(req.id, None)
            handle = self.handles.get(req.id)
            if handle is not None:
                self._finish(handle, "stop" if reason == "eos" else "length")

    def _finish(self, handle: RequestHandle, reason: str) -> None:
        """End the stream and record the request's latencies as it really ran: a stop (string or
        eos) ends it before ``output_len``, which the scheduler's copy must keep until dropped."""
        req = self.handles.pop(handle.req.id).req
        tokens = max(1, handle.completion_tokens)
        finish = req.finish if req.finish is not None else self.clock()
        handle.end(reason)
        self.metrics.observe_finished(replace(req, output_len=tokens, generated=tokens, finish=finish))
        self.metrics.record_request("finished")

    async def _migrate(self, move: Migrate) -> None:
        """Stage a prefilled request's KV on its source and hand it to the target's driver, which
        imports it at its next boundary; the staged copy lives until then."""
        req, source, target = move.request, move.source, move.target
        start = self.clock()
        try:
            async with self.clients[source].exported(req.id, req.prompt_len) as blob:
                landing = Landing(move, blob, start, self.clock(), asyncio.get_running_loop().create_future())
                self._landings[target].append(landing)
                self._wakeups[target].set()
                await landing.done
        except (WorkerDied, WorkerError) as exc:
            self._carry_out(self.cluster.migration_failed(req, source, target, f"KV migration failed: {exc}"))

    async def _land(self, worker_id: int) -> None:
        """Import the KV staged for this worker before planning its next iteration, so a migrated
        request joins that iteration: a worker runs one command at a time, so an import sent while
        it computes would run only after the next step had been planned without the request.
        A migration's time is its export plus its import, not the wait for this boundary."""
        landings, self._landings[worker_id] = self._landings[worker_id], []
        for landing in landings:
            req, source = landing.move.request, landing.move.source
            begin = self.clock()
            try:
                await self.clients[worker_id].import_kv(req.id, landing.blob, req.prompt_len)
            except (WorkerDied, WorkerError) as exc:
                self._migration_failed(landing, f"KV migration failed: {exc}")
            else:
                self._record_migration(landing, begin, self.clock())
                self._carry_out(self.cluster.migrated(req, source, worker_id))
            finally:
                landing.release()

    def _record_migration(self, landing: Landing, landed: float, imported: float) -> None:
        """A migration's time (export plus import) into the request, /metrics and the log."""
        move, req = landing.move, landing.move.request
        req.migration_time = landing.exported - landing.staged + imported - landed
        self.metrics.record_migration(req.migration_time, req.prompt_len)
        if self.iteration_log is not None:
            self.iteration_log.write(MigrationRecord(req.id, move.source, move.target, req.prompt_len,
                                                     landing.staged, landing.exported, landed, imported))

    def _migration_failed(self, landing: Landing, reason: str) -> None:
        move = landing.move
        self._carry_out(self.cluster.migration_failed(move.request, move.source, move.target, reason))
        landing.release()

    def _fail_requests(self, rids: list[int], reason: str) -> None:
        """Between iterations: end ``rids`` with an internal error (500) and drop them from the
        cluster, which frees their KV and wakes what waited for it; every other request goes on."""
        for rid in rids:
            handle = self.handles.get(rid)
            self.sequences.pop(rid, None)
            self._carry_out(self.cluster.abort(rid, self.clock()))
            if handle is not None:
                self._end_with_error(handle, reason, 500)

    def _fail(self, req: Request, reason: str) -> None:
        """End ``req``'s stream with ``reason`` (unless it ended, or was re-run as a new request):
        the cluster has dropped it, so the server could not serve it (503)."""
        handle = self.handles.get(req.id)
        if handle is None or handle.req is not req:
            return
        self.sequences.pop(req.id, None)
        self._end_with_error(handle, reason, 503)

    def _end_with_error(self, handle: RequestHandle, reason: str, status: int) -> None:
        """End a stream with an error event mapped to ``status`` (503: the server could not serve
        it now; 500: an internal failure); the cluster's copy is the caller's business."""
        del self.handles[handle.req.id]
        handle.req.fail(self.clock(), reason)
        handle.end(error=reason, status=status)
        self.metrics.record_request("failed")

    def _worker_died(self, worker_id: int) -> None:
        """Take the dead worker out of the policy's view and keep serving: requests that have
        streamed nothing yet start over elsewhere (unless they asked not to), the rest end with a
        clear error."""
        lost, effects = self.cluster.worker_died(worker_id, self.clock())
        landings, self._landings[worker_id] = self._landings[worker_id], []
        for landing in landings:
            self._migration_failed(landing, f"KV migration failed: worker {worker_id} died")
        for req in lost:
            handle = self.handles.get(req.id)
            if handle is not None and handle.completion_tokens == 0 and handle.submission.retry:
                self._rerun(handle)
            elif handle is not None:
                self._fail(req, self._death_note(worker_id, handle))
        self.metrics.set_worker(worker_id, self.workers[worker_id].role.value, 0, 0, 0.0, alive=False,
                                node=self.clients[worker_id].node)
        self._carry_out(effects)

    def _death_note(self, worker_id: int, handle: RequestHandle) -> str:
        why = (f"after this request had generated {handle.completion_tokens} tokens (a request "
               f"runs again elsewhere only before its first token)" if handle.completion_tokens
               else "and this request asked not to be retried")
        return f"worker {worker_id} died {why}"

    def revive(self, worker_id: int) -> None:
        """A restarted worker serves again: a fresh state (empty KV pool) with the old role, rules,
        latency and cache size, and a new driver in place of the dead one's."""
        effects = self.cluster.worker_revived(worker_id, self.clock())
        self._aborts[worker_id], self._frees[worker_id] = set(), []
        self._tasks[worker_id].cancel()
        self._tasks[worker_id] = self._driver(worker_id)
        self.metrics.record_revival(worker_id)
        self._report(self.workers[worker_id])
        self._carry_out(effects)

    def _rerun(self, handle: RequestHandle) -> None:
        """Submit ``handle``'s request again from its prompt, as a fresh arrival at its old time."""
        old, sub = handle.req, handle.submission
        req = Request(old.id, old.arrival, old.prompt_len, old.output_len, old.slo)
        handle.req = req
        effects = self.cluster.arrive(req, self.clock())
        refused = next((e.reason for e in effects if isinstance(e, Fail)), None)
        if refused is not None:
            self._fail(req, f"its worker died and no live worker can run it: {refused}")
            return
        self._track(req, sub)
        self.metrics.record_request("rerun")
        self._carry_out(effects)

    def _report(self, worker: WorkerState) -> None:
        used = worker.kv.used_blocks / worker.kv.capacity_blocks if worker.kv.capacity_blocks else 0.0
        self.metrics.set_worker(worker.id, worker.role.value, len(worker.running), len(worker.waiting),
                                used, alive=worker.alive, node=self.clients[worker.id].node)

    @property
    def unavailable(self) -> str | None:
        """Why no new request could be served now (for /health), or None when one could: the
        admission rules applied to the smallest request."""
        return SHUTTING_DOWN if self.draining else serving_error(self.workers)

    async def drain(self, timeout: float) -> None:
        """Stop taking requests and wait (up to ``timeout``) for those in flight to finish; those
        still running then end with an error saying why, so no stream is cut without one (their
        KV is dropped at their worker's next boundary, as for a client that left)."""
        self.draining = True
        deadline = self.clock() + timeout
        while self.handles and self.clock() < deadline:
            await asyncio.sleep(0.05)
        for handle in list(self.handles.values()):
            self._end_with_error(handle, f"{SHUTTING_DOWN}: its drain timeout passed before this "
                                         "request finished", 503)
            self._abort_on(self.cluster.where(handle.req.id), handle.req.id)
