"""Discrete-event simulation of a cluster on a virtual clock.

The simulator owns time and KV transfers; scheduling is the sched layer's: the same policy
objects and the same per-worker batch formation the server uses. Between two events a worker's
decode iterations differ only by growing contexts, so a run of them is priced in closed form
(see ``DecodeRun``) and cut short at the next iteration boundary when new work reaches it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from tropical.core.latency.model import LatencyModel
from tropical.core.metrics import attains
from tropical.core.request import Request
from tropical.sched.admission import admission_error
from tropical.sched.batching import Batch, form_batch
from tropical.sched.policy import Policy, apply
from tropical.sched.worker import WorkerState
from tropical.sim.decode_run import DecodeRun

_ITER_END, _MIGRATED = 0, 1


@dataclass(slots=True)
class Flight:
    """What a worker is executing: one batch, or a closed-form run of decode iterations."""

    start: float
    end: float
    version: int
    batch: Batch | None = None
    run: DecodeRun | None = None


@dataclass(slots=True)
class WorkerStats:
    """Per-worker accounting for reports."""

    busy: float = 0.0
    iterations: int = 0
    prefill_tokens: int = 0


class Simulator:
    """Replays requests through a policy on a set of workers; deterministic for its inputs."""

    def __init__(self, workers: Sequence[WorkerState], policy: Policy,
                 requests: Sequence[Request], max_context: int | None = None,
                 miss_budget: int | None = None,
                 truth: Sequence[LatencyModel] | None = None) -> None:
        """``miss_budget``: stop once more requests than this have missed their SLO (a capacity
        search only needs to know the target is out of reach); the rest are marked failed.
        ``truth``: the latency models that time execution, one per worker, when the policy's
        predictors (the workers' ``latency``) are not exact."""
        self.workers = list(workers)
        self.truth = list(truth) if truth is not None else [w.latency for w in self.workers]
        self.max_context = max_context
        self.miss_budget = miss_budget
        self.misses = 0
        self.policy = policy
        self.requests = sorted(requests, key=lambda r: (r.arrival, r.id))
        self.stats = [WorkerStats() for _ in self.workers]
        self.now = 0.0
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()
        self._flights: dict[int, Flight] = {}
        self._versions = itertools.count()
        self._stalled: list[tuple[Request, WorkerState]] = []

    def run(self) -> list[Request]:
        """Simulate until every request has finished or failed; returns them in arrival order."""
        arrivals = iter(self.requests)
        upcoming = next(arrivals, None)
        while (upcoming is not None or self._events) and not self._out_of_budget():
            if upcoming is not None and (not self._events or upcoming.arrival <= self._events[0][0]):
                self.now = upcoming.arrival
                self._arrive(upcoming)
                upcoming = next(arrivals, None)
                continue
            self.now, _, kind, payload = heapq.heappop(self._events)
            if kind == _ITER_END:
                self._iteration_end(*payload)
            else:
                self._migrated(*payload)
        self._fail_leftovers()
        return self.requests

    def _out_of_budget(self) -> bool:
        return self.miss_budget is not None and self.misses > self.miss_budget

    def _first_token(self, req: Request) -> None:
        """A late first token is a certain miss."""
        self.misses += req.first_token - req.arrival > req.slo.ttft

    def _finished(self, requests: Sequence[Request]) -> bool:
        """Count TPOT misses of requests whose TTFT was on time; True if any finished."""
        self.misses += sum(r.first_token - r.arrival <= r.slo.ttft and not attains(r) for r in requests)
        return bool(requests)

    def _push(self, time: float, kind: int, payload: tuple) -> None:
        heapq.heappush(self._events, (time, next(self._seq), kind, payload))

    def _arrive(self, req: Request) -> None:
        error = admission_error(req, self.workers, self.max_context)
        if error is not None:
            req.fail(self.now, error)
            return
        self._settle_all()
        self._apply(self.policy.on_arrival(req, self.now, self.workers))
        self._honor_checks()

    def _run_length(self, worker: WorkerState) -> int:
        """Decode iterations to run in closed form: up to the next finish, or fewer when the
        policy wants to see iteration ends."""
        if self.policy.wants_iteration_events():
            return 1
        steps = worker.steps_to_next_finish()
        check = self.policy.check_step(worker)
        return steps if check is None else max(1, min(steps, check - worker.steps))

    def _honor_checks(self) -> None:
        """End runs early where the policy now wants to look sooner (runs are settled here, so
        a run's first iteration is the one in progress)."""
        for worker_id, flight in list(self._flights.items()):
            if flight.run is not None:
                self._cut_run(self.workers[worker_id], self._run_length(self.workers[worker_id]))

    def _apply(self, assignments: list) -> None:
        """Hand over every decision first, then wake the workers: prefills the policy planned
        for one iteration must start together."""
        woken = {apply(a, self.workers).id: None for a in assignments}
        for worker_id in woken:
            self._wake(self.workers[worker_id])

    def _wake(self, worker: WorkerState) -> None:
        """New work reached ``worker``: start it if idle, else end its decode run early."""
        if worker.id in self._flights:
            self._cut_run(worker)
        else:
            self._start(worker)

    def _start(self, worker: WorkerState) -> None:
        if worker.id in self._flights or not worker.alive:
            return
        worker.admit_inbox()
        batch = form_batch(worker, self.now)
        if batch.is_empty:
            return
        version = next(self._versions)
        if batch.decode_only:
            steps = self._run_length(worker)
            run = DecodeRun.start(worker, steps, self.truth[worker.id])
            flight = Flight(self.now, self.now + run.duration, version, run=run)
            worker.busy_until = self.now + run.iteration(1)
        else:
            for req, _, _ in batch.prefills:
                if req.prefill_start is None:
                    req.prefill_start = self.now
            duration = self.truth[worker.id].iteration_time(batch.shape)
            flight = Flight(self.now, self.now + duration, version, batch=batch)
            worker.busy_until = flight.end
        self._flights[worker.id] = flight
        self._push(flight.end, _ITER_END, (worker.id, version))

    def _settle_all(self) -> None:
        """Book every decode iteration completed by now, so policies see exact worker states."""
        for worker_id, flight in self._flights.items():
            run = flight.run
            if run is None or self.now < self.workers[worker_id].busy_until:
                continue
            done = run.completed_by(self.now - flight.start)
            if done:
                elapsed = run.elapsed(done)
                self.workers[worker_id].advance_decodes(done, flight.start + elapsed,
                                                        run.iteration(1), run.growth)
                self.stats[worker_id].busy += elapsed
                self.stats[worker_id].iterations += done
                flight.start += elapsed
                flight.run = run.rest_after(done)
                self.workers[worker_id].busy_until = flight.start + flight.run.iteration(1)

    def _cut_run(self, worker: WorkerState, steps: int | None = None) -> None:
        """Shorten a decode run: to ``steps`` iterations, or else to end at the first iteration
        boundary from now."""
        flight = self._flights.get(worker.id)
        if flight is None or flight.run is None or flight.run.steps == 1:
            return
        run = flight.run.cut_at(self.now - flight.start) if steps is None else flight.run.cut_to(steps)
        if run.steps >= flight.run.steps:
            return
        flight.run, flight.end, flight.version = run, flight.start + run.duration, next(self._versions)
        self._push(flight.end, _ITER_END, (worker.id, flight.version))

    def _iteration_end(self, worker_id: int, version: int) -> None:
        flight = self._flights.get(worker_id)
        if flight is None or flight.version != version:
            return
        del self._flights[worker_id]
        worker = self.workers[worker_id]
        stats = self.stats[worker_id]
        stats.busy += flight.end - flight.start
        if flight.run is not None:
            stats.iterations += flight.run.steps
            freed = self._finished(worker.advance_decodes(flight.run.steps, self.now,
                                                              flight.run.iteration(1), flight.run.growth))
        else:
            stats.iterations += 1
            freed = self._finish_batch(worker, flight.batch)
        worker.busy_until = self.now
        if freed:
            self._retry_stalled()
        if self.policy.observes_iterations:
            self._settle_all()
            self._apply(self.policy.on_iteration_end(worker, self.now, self.workers))
            self._honor_checks()
        self._start(worker)

    def _finish_batch(self, worker: WorkerState, batch: Batch) -> bool:
        """Book a finished batch; returns True when some KV was freed."""
        freed = bool(batch.decode_count) and self._finished(worker.advance_decodes(1, self.now))
        for req, new, _ in batch.prefills:
            self.stats[worker.id].prefill_tokens += new
            if worker.complete_prefill(req, new, self.now):
                self._first_token(req)
                freed |= req.finish is not None
                if not worker.role.decodes and req.finish is None:
                    self._migrate(req, worker)
        return freed

    def _migrate(self, req: Request, source: WorkerState) -> None:
        self._settle_all()
        target = self.policy.decode_worker(req, self.workers, self.now)
        if target is None:
            self._stalled.append((req, source))
            return
        target.expect_migration(req)
        req.migration_time = self.truth[source.id].transfer_time(req.prompt_len)
        self._push(self.now + req.migration_time, _MIGRATED, (req, source.id, target.id))

    def _migrated(self, req: Request, source_id: int, target_id: int) -> None:
        source, target = self.workers[source_id], self.workers[target_id]
        source.release(req)
        target.arrive_migrated(req)
        self._wake(target)
        self._start(source)

    def _retry_stalled(self) -> None:
        stalled, self._stalled = self._stalled, []
        for req, source in stalled:
            self._migrate(req, source)

    def _fail_leftovers(self) -> None:
        reason = ("not simulated: the miss budget was exhausted" if self._out_of_budget()
                  else "never scheduled: the cluster could not make room for it")
        for req in self.requests:
            if not req.done:
                req.fail(self.now, reason)
