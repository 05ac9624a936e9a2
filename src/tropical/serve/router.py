"""The routers: asyncio, HTTP streams and worker drivers around sched's ``Cluster``.

The Cluster decides (the same one the simulator drives); a router carries out its effects on real
workers. ``RouterBase`` is what every substrate shares: admitting or refusing a request, running
again one whose worker died before its first token, each worker's load in /metrics, the drain, and
the dispatch of the Cluster's effects to the substrate's own ways of carrying them out. Own-engine
workers are stepped (``Router``, here); vLLM instances plan their own iterations
(``vllm.driver.VllmDriver``).

``Router``'s driver task for each worker runs its iterations as nano-vllm's engine runs its
steps: schedule (``Cluster.plan``), execute (the worker runs the step), post-process
(``Cluster.book`` the sampled tokens, stream them, then do what the booking asks: migrate KV, free
KV, wake workers). Aborts and migrated KV are applied between the iterations of the worker holding
the request. A worker that dies fails or re-runs its requests and leaves the policy's view; one its
backend restarts (Ray) comes back with an empty KV cache (``revive``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, TypeVar, cast

from tropical.core.latency.model import LatencyModel
from tropical.core.request import Request
from tropical.core.slo import SLO, SLOSpec
from tropical.engine.block_hash import block_hashes
from tropical.engine.kv_events import KVEvent, follow
from tropical.sched.admission import NO_LIVE_WORKER, serving_error
from tropical.sched.batching import Batch
from tropical.sched.cluster import Assigned, Cluster, Effect, Fail, Free, Migrate, Wake
from tropical.sched.policy import Policy
from tropical.sched.step import TokenSequence, record_step, step_spec
from tropical.sched.worker import WorkerState
from tropical.serve.inflight import InFlight
from tropical.serve.iteration_log import IterationLog, IterationRecord, MigrationRecord
from tropical.serve.metrics import ServerMetrics
from tropical.serve.streams import RequestHandle, Submission
from tropical.serve.workers.driver import Landing, WorkerDriver
from tropical.serve.workers.handle import WorkerDied, WorkerError, WorkerHandle
from tropical.serve.workers.messages import Step, StepDone

if TYPE_CHECKING:  # the tokenizer's module loads torch (GGUF vocabularies); the router does not
    from tropical.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)
SHUTTING_DOWN = "the server is shutting down"


class Rejected(Exception):
    """The router will not take a request now; ``status`` is 429 (overloaded) or 503 (unavailable)
    or 400 (it can never run here); ``retry_after``: seconds until the predicted backlog that
    refused it clears (the admission stage's refusals)."""

    def __init__(self, status: int, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.retry_after = status, reason, retry_after


@dataclass(frozen=True, slots=True)
class RouterSettings:
    """Limits and defaults: ``max_waiting`` requests may queue before 429s; ``slo`` prices
    requests that name no SLO of their own."""

    max_waiting: int = 256
    slo: SLOSpec = SLOSpec()
    max_context: int | None = None


def refusal(effects: list[Effect]) -> str | None:
    """Why the cluster refused an arriving request, if it did."""
    return next((e.reason for e in effects if isinstance(e, Fail)), None)


async def cancel(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel ``tasks`` and wait until each has ended."""
    cancelled = list(tasks)
    for task in cancelled:
        task.cancel()
    await asyncio.gather(*cancelled, return_exceptions=True)


class Client(Protocol):
    """What every router asks of a worker's client, whatever runs behind it."""

    @property
    def alive(self) -> bool: ...

    @property
    def node(self) -> str: ...


C = TypeVar("C", bound=Client)


class RouterBase(ABC, Generic[C]):
    """The Cluster, the clients of the workers it runs on, and the requests in flight; what every
    substrate's router does with them. A subclass says how its workers carry out the Cluster's
    effects (``_wake``, ``_migrate``; ``_assigned``, ``_free`` and ``_release`` where they need
    doing) and how a request in flight is stopped there (``_stop``)."""

    WORKER: ClassVar[str] = "worker"
    """What the messages call a worker."""

    def __init__(self, policy: Policy, workers: Sequence[WorkerState], clients: Sequence[C],
                 tokenizer: Tokenizer, reference: LatencyModel, settings: RouterSettings,
                 metrics: ServerMetrics, clock: Callable[[], float]) -> None:
        self.cluster = Cluster(workers, policy, settings.max_context)
        self.clients = list(clients)
        self.inflight = InFlight(tokenizer, metrics, clock)
        self.tokenizer = tokenizer
        self.reference = reference
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.draining = False
        self._ids = itertools.count()

    @property
    def workers(self) -> list[WorkerState]:
        return self.cluster.workers

    @property
    def handles(self) -> dict[int, RequestHandle]:
        return self.inflight.handles

    def start(self) -> None:
        """Show every worker's load from the start (a subclass starts its tasks first)."""
        for worker in self.workers:
            self._report(worker)

    @property
    def unavailable(self) -> str | None:
        """Why no new request could be served now (for /health), or None when one could: the
        admission rules applied to the smallest request."""
        return SHUTTING_DOWN if self.draining else serving_error(self.workers)

    def slo_of(self, submission: Submission) -> SLO:
        return submission.slo(self.settings.slo, self.reference)

    def submit(self, submission: Submission) -> RequestHandle:
        """Admit a request and let the Cluster place its prefill; raises Rejected."""
        self._check_capacity()
        now = self.clock()
        req = self._request(next(self._ids), now, submission, submission.max_tokens, self.slo_of(submission))
        effects = self.cluster.arrive(req, now)
        refused = refusal(effects)
        if refused is not None:
            raise self._rejected(effects, refused)
        handle = self.inflight.open(req, submission)
        self._carry_out(effects)
        return handle

    def _check_capacity(self) -> None:
        """Refuse a new request while draining (503), with no worker running (503) or past
        ``max_waiting`` queued requests (429)."""
        if self.draining:
            raise Rejected(503, SHUTTING_DOWN)
        if not any(c.alive for c in self.clients):
            raise Rejected(503, f"no {self.WORKER} is running")
        waiting = sum(len(w.waiting) for w in self.workers if w.alive)
        if waiting >= self.settings.max_waiting:
            self.metrics.record_rejection("queue_full")
            raise Rejected(429, f"server overloaded: {waiting} requests waiting "
                                f"(limit {self.settings.max_waiting}); retry later")

    def _rejected(self, effects: list[Effect], reason: str) -> Rejected:
        """What refusing an arriving request answers: the admission stage's refusal is a 429
        (counted by its reason), one the request can never pass a 503 or a 400."""
        admission = next((e.refusal for e in effects if isinstance(e, Fail) and e.refusal), None)
        if admission is not None:
            self.metrics.record_rejection(admission.reason)
            return Rejected(429, reason, admission.retry_after)
        return Rejected(503 if reason.startswith(NO_LIVE_WORKER) else 400, reason)

    def _request(self, rid: int, arrival: float, submission: Submission, max_tokens: int, slo: SLO
                 ) -> Request:
        """A request, named by its prompt's full blocks (``prefix``) as the workers' prefix caches
        name them, when they keep one; one asking for prompt logprobs is not named, so it hits
        nothing cached and every prompt position is computed (as vLLM v1 does)."""
        kv = self.workers[0].kv
        prompt_ids = submission.prompt_ids
        named = kv.cache is not None and submission.params.prompt_logprobs is None
        prefix = block_hashes(prompt_ids, kv.block_size) if named else ()
        return Request(rid, arrival, len(prompt_ids), max_tokens, slo, prefix=prefix,
                       prefix_block=kv.block_size)

    def abort(self, rid: int) -> None:
        """The client went away: stop generating and free the request's KV."""
        if self.inflight.leave(rid):
            self._stop(rid)

    async def drain(self, timeout: float) -> None:
        """Stop taking requests and wait (up to ``timeout``) for those in flight to finish; those
        still running then end with an error saying why, so no stream is cut without one, and are
        stopped on their workers (as for a client that left)."""
        self.draining = True
        deadline = self.clock() + timeout
        while self.handles and self.clock() < deadline:
            await asyncio.sleep(0.05)
        for handle in list(self.handles.values()):
            self.inflight.end_with_error(handle, f"{SHUTTING_DOWN}: its drain timeout passed before this "
                                                 "request finished", 503)
            self._stop(handle.req.id)

    def _carry_out(self, effects: list[Effect]) -> None:
        """Do what the Cluster asks, on the workers and the streams."""
        for effect in effects:
            if isinstance(effect, Assigned):
                self.metrics.record_path(effect.request.path.value)
                self._assigned(effect)
            elif isinstance(effect, Wake):
                self._wake(effect.worker_id)
            elif isinstance(effect, Migrate):
                self._migrate(effect)
            elif isinstance(effect, Free):
                self._free(effect)
            elif isinstance(effect, Fail):
                self._dropped(effect)

    def _dropped(self, fail: Fail) -> None:
        """The Cluster dropped a request: the server could not serve it (503), or the admission
        stage refused it while it queued (429)."""
        self._release(fail.request.id)
        if fail.refusal is not None:
            self.metrics.record_rejection(fail.refusal.reason)
        self.inflight.fail(fail.request, fail.reason, 503 if fail.refusal is None else 429)

    def _fail(self, rid: int, reason: str) -> None:
        """End ``rid`` with an internal error (500) and drop it from the Cluster, which frees its
        KV and wakes what waited for it; every other request goes on."""
        handle = self.inflight.handles.get(rid)
        self._drop(rid)
        if handle is not None:
            self.inflight.end_with_error(handle, reason, 500)

    def _drop(self, rid: int) -> None:
        """Take ``rid`` out of the Cluster, and what its worker runs for it."""
        self._release(rid)
        self.inflight.forget(rid)
        self._carry_out(self.cluster.abort(rid, self.clock()))

    def _worker_died(self, worker_id: int) -> None:
        """Take the dead worker out of the Cluster and keep serving: requests that have streamed
        nothing yet start over elsewhere (unless they asked not to), the rest end with a clear
        error."""
        lost, effects = self.cluster.worker_died(worker_id, self.clock())
        self._died(worker_id)
        for req in lost:
            self._release(req.id)
            handle = self.inflight.lost(req, worker_id)
            if handle is not None:
                self._rerun(handle)
        self._report(self.workers[worker_id])
        self._carry_out(effects)

    def _rerun(self, handle: RequestHandle) -> None:
        """Submit ``handle``'s request again from its prompt, as a fresh arrival at its old time."""
        old, sub = handle.req, handle.submission
        req = self._request(old.id, old.arrival, sub, old.output_len, old.slo)
        handle.req = req
        effects = self.cluster.arrive(req, self.clock())
        refused = refusal(effects)
        if refused is not None:
            self.inflight.fail(req, f"its {self.WORKER} died and no live {self.WORKER} can run it: {refused}")
            return
        self.inflight.track(req, sub)
        self.metrics.record_request("rerun")
        self._carry_out(effects)

    def _revived(self, worker_id: int) -> None:
        """A restarted worker serves again: the Cluster gets a fresh state of it (empty KV pool)
        with the old role, rules, latency and cache size, and /metrics counts the revival."""
        effects = self.cluster.worker_revived(worker_id, self.clock())
        self.metrics.record_revival(worker_id)
        self._report(self.workers[worker_id])
        self._carry_out(effects)

    def _report(self, worker: WorkerState) -> None:
        """A worker's load into /metrics; a dead one runs nothing, whatever its last state held."""
        kv, alive = worker.kv, worker.alive
        used = kv.used_blocks / kv.capacity_blocks if kv.capacity_blocks and alive else 0.0
        running, waiting = (len(worker.running), len(worker.waiting)) if alive else (0, 0)
        self.metrics.set_worker(worker.id, worker.role.value, running, waiting, used, alive=alive,
                                node=self.clients[worker.id].node)

    @abstractmethod
    def _stop(self, rid: int) -> None:
        """Stop running ``rid``, whose stream has ended, on its worker and free its KV."""

    @abstractmethod
    def _wake(self, worker_id: int) -> None:
        """The worker has new work: have it plan its next iteration."""

    @abstractmethod
    def _migrate(self, move: Migrate) -> None:
        """Move a prefilled request's KV from its source to its target."""

    def _assigned(self, placed: Assigned) -> None:
        """The Cluster placed a request on a worker (stepped workers need nothing: it is planned)."""

    def _free(self, free: Free) -> None:
        """The Cluster freed a request's KV on a worker (self-scheduled ones free it themselves)."""

    def _release(self, rid: int) -> None:
        """Let go of what this router runs for ``rid`` beyond the Cluster's copy (nothing here)."""

    def _died(self, worker_id: int) -> None:
        """The Cluster has let a dead worker go: end what was under way with it (nothing here)."""


@dataclass(frozen=True, slots=True)
class Iteration:
    """An iteration planned on ``worker``: its batch, the step the worker runs for it, when it
    started and how long the policy expects it to take."""

    worker: WorkerState
    batch: Batch
    step: Step
    start: float
    predicted: float


class Router(RouterBase[WorkerHandle]):
    """The Cluster over own-engine workers, the driver of each, and the requests in flight."""

    def __init__(self, policy: Policy, workers: Sequence[WorkerState], clients: Sequence[WorkerHandle],
                 tokenizer: Tokenizer, reference: LatencyModel,
                 settings: RouterSettings, metrics: ServerMetrics,
                 clock: Callable[[], float] = time.monotonic,
                 iteration_log: IterationLog | None = None) -> None:
        super().__init__(policy, workers, clients, tokenizer, reference, settings, metrics, clock)
        self.drivers = [WorkerDriver(i, client) for i, client in enumerate(self.clients)]
        self.iteration_log = iteration_log
        for client in self.clients:
            client.on_death = self._worker_died
            client.on_revive = self.revive

    @property
    def sequences(self) -> dict[int, TokenSequence]:
        return self.inflight.sequences

    def start(self) -> None:
        for driver in self.drivers:
            driver.run(self._drive(driver))
        super().start()

    async def stop(self) -> None:
        await cancel(d.task for d in self.drivers if d.task is not None)

    def _stop(self, rid: int) -> None:
        """Drop ``rid`` at its worker's next boundary (it may be in the middle of a step)."""
        self._abort_on(self.cluster.where(rid), rid)

    def _abort_on(self, worker_id: int | None, rid: int) -> None:
        if worker_id is not None:
            self.drivers[worker_id].abort(rid)

    def _wake(self, worker_id: int) -> None:
        self.drivers[worker_id].wake()

    def _migrate(self, move: Migrate) -> None:
        asyncio.create_task(self._export(move))

    def _free(self, free: Free) -> None:
        self.drivers[free.worker_id].free(free.request_id)

    async def _drive(self, driver: WorkerDriver) -> None:
        """Run this worker's iterations back to back while it has work; sleep otherwise. A bug in
        a step must not end the driver silently (every later request would hang): it fails the
        worker's requests, which leaves its state clean, and the driver goes on."""
        while driver.client.alive:
            await driver.wakeup.wait()
            driver.wakeup.clear()
            try:
                while driver.client.alive and await self._step(driver):
                    pass
            except Exception as exc:  # noqa: BLE001 - logged, and the worker's requests hear of it
                log.exception("worker %d's driver failed; failing its requests", driver.worker_id)
                self._fail_requests([r.id for r in self.cluster.on_worker(driver.worker_id)],
                                    f"internal error on worker {driver.worker_id}: {exc!r}")

    async def _step(self, driver: WorkerDriver) -> bool:
        """One iteration: schedule, execute, post-process; False when the worker has nothing to run."""
        await self._between_iterations(driver)
        iteration = self._schedule(driver)
        if iteration is None:
            await self._idle(driver)
            return False
        try:
            done = await driver.step(iteration.step)
        except WorkerDied:
            return False  # its requests run again or fail: see _worker_died
        except WorkerError as exc:
            self._step_failed(iteration, exc)
            return True
        await self._postprocess(iteration, done)
        return True

    async def _between_iterations(self, driver: WorkerDriver) -> None:
        """Drop the requests aborted here, then import the KV migrated here."""
        for rid in driver.take_aborts():
            at = self.cluster.where(rid)
            if at != driver.worker_id:  # it moved since: drop it between its new worker's iterations
                self._abort_on(at, rid)
                continue
            self._drop(rid)
        await self._land(driver)

    def _schedule(self, driver: WorkerDriver) -> Iteration | None:
        """The worker's next iteration, as the Cluster plans it (None: nothing to run), with the
        KV frees queued for it."""
        worker = self.cluster.workers[driver.worker_id]
        start = self.clock()
        batch = self.cluster.plan(driver.worker_id, start)
        if batch is None:
            return None
        spec = step_spec(batch, worker.running, self.inflight.sequences, self.inflight.eos)
        predicted = worker.latency.iteration_time(batch.shape)
        self.cluster.expect_end(driver.worker_id, start + predicted)
        return Iteration(worker, batch, Step(spec, driver.take_frees()), start, predicted)

    async def _idle(self, driver: WorkerDriver) -> None:
        """Nothing to run: free the KV queued for the worker now, and show it idle."""
        worker = self.workers[driver.worker_id]
        frees = driver.take_frees()
        if frees:
            await driver.free_now(frees)
        self._report(worker)

    def _step_failed(self, iteration: Iteration, exc: WorkerError) -> None:
        """The worker could not run the step: its requests fail (500), the worker serves on."""
        self.cluster.expect_end(iteration.worker.id, self.clock())
        self._fail_requests([cast(int, span.seq_id) for span in iteration.step.spec.spans],  # request ids
                            f"the step running this request failed: {exc}")

    async def _postprocess(self, iteration: Iteration, done: StepDone) -> None:
        """Book the sampled tokens, stream them, and do what the booking asks."""
        worker = iteration.worker
        end = self.clock()
        recorded = record_step(done.output, self.inflight.sequences, self.inflight.eos)
        eos, broken = recorded.ended, recorded.failed
        for rid, why in broken.items():  # its stream ends with the error; the cluster drops it below
            self.inflight.end_with_error(self.inflight.handles[rid], why, 500)
        self._follow(worker, done.events)
        booking = self.cluster.book(worker.id, iteration.batch, end, eos=eos)
        for rid in [*self.inflight.stream(done.tokens, booking.finished, eos, done.logprobs), *broken]:
            self._abort_on(worker.id, rid)  # a stop string or its grammar ended it: drop it next boundary
        self._carry_out(booking.effects)
        self._report(worker)
        self._record_iteration(iteration, done.seconds)
        if any(isinstance(e, Migrate) for e in booking.effects):
            # Let the migrations just started send their exports now, so they run at this boundary
            # instead of waiting behind the worker's next iteration (the simulator moves KV at once).
            await asyncio.sleep(0)

    @staticmethod
    def _follow(worker: WorkerState, events: list[KVEvent]) -> None:
        """The worker's KV events since its last step, into the policy's model of its cache."""
        if worker.kv.cache is not None:
            disagree = follow(worker.kv.cache, events)
            if disagree:
                log.warning("worker %d evicted %d prefix blocks its model holds referenced", worker.id,
                            len(disagree))

    def _record_iteration(self, iteration: Iteration, compute: float) -> None:
        """An iteration's times into /metrics, and into the iteration log when there is one."""
        worker_id, batch = iteration.worker.id, iteration.batch
        wall = self.clock() - iteration.start
        self.metrics.record_iteration(worker_id, wall, compute, iteration.predicted)
        self.metrics.record_prefill_chunks(sum(c + n < r.prompt_len for r, n, c in batch.prefills))
        starts = [(r.prompt_len, c) for r, _, c in batch.prefills if c == r.cached]  # a prompt's first span
        self.metrics.record_prefix_cache(worker_id, sum(p for p, _ in starts), sum(c for _, c in starts))
        if self.iteration_log is not None:
            self.iteration_log.write(IterationRecord(worker_id, iteration.start, batch.shape, wall, compute,
                                                     iteration.predicted))

    async def _export(self, move: Migrate) -> None:
        """Stage a prefilled request's KV on its source for the target's driver, which imports it
        at its next boundary."""
        try:
            await self.drivers[move.source].export(move, self.drivers[move.target], self.clock)
        except (WorkerDied, WorkerError) as exc:
            self._carry_out(self.cluster.migration_failed(move.request, move.source, move.target,
                                                          f"KV migration failed: {exc}"))

    async def _land(self, driver: WorkerDriver) -> None:
        """Import the KV staged for this worker before planning its next iteration, so a migrated
        request joins that iteration: a worker runs one command at a time, so an import sent while
        it computes would run only after the next step had been planned without the request.
        A migration's time is its export plus its import, not the wait for this boundary."""
        for landing in driver.take_landings():
            req, source = landing.move.request, landing.move.source
            begin = self.clock()
            try:
                events = await driver.land(landing)
            except (WorkerDied, WorkerError) as exc:
                self._migration_failed(landing, f"KV migration failed: {exc}")
            else:
                self._follow(self.workers[driver.worker_id], events)
                self._record_migration(landing, begin, self.clock())
                self._carry_out(self.cluster.migrated(req, source, driver.worker_id))
            finally:
                landing.release()

    def _record_migration(self, landing: Landing, landed: float, imported: float) -> None:
        """A migration's time (export plus import) into the request, /metrics and the log."""
        move, req = landing.move, landing.move.request
        req.migration_time = landing.exported - landing.staged + imported - landed
        self.metrics.record_migration(req.migration_time, move.tokens)
        if self.iteration_log is not None:
            self.iteration_log.write(MigrationRecord(req.id, move.source, move.target, req.prompt_len,
                                                     landing.staged, landing.exported, landed, imported))

    def _migration_failed(self, landing: Landing, reason: str) -> None:
        move = landing.move
        self._carry_out(self.cluster.migration_failed(move.request, move.source, move.target, reason))
        landing.release()

    def _fail_requests(self, rids: list[int], reason: str) -> None:
        """Between iterations: end ``rids`` with an internal error (500); every other request goes on."""
        for rid in rids:
            self._fail(rid, reason)

    def _died(self, worker_id: int) -> None:
        """The KV staged for the dead worker will not land: its migrations fail (or retry)."""
        for landing in self.drivers[worker_id].take_landings():
            self._migration_failed(landing, f"KV migration failed: worker {worker_id} died")

    def revive(self, worker_id: int) -> None:
        """A restarted worker serves again, with a new driver task in place of the dead one's."""
        driver = self.drivers[worker_id]
        driver.forget()
        driver.run(self._drive(driver))
        self._revived(worker_id)
