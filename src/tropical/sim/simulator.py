"""Discrete-event simulation of a cluster on a virtual clock.

The simulator owns time and KV transfers; scheduling is sched's ``Cluster``, the same one the
server drives. Between two events a worker's decode iterations differ only by growing contexts,
so a run of them is priced in closed form (see ``DecodeRun``) and cut short at the next
iteration boundary when new work reaches it. A run is booked at its end, and in part only when a
decision reads the worker before then (``sched.lag``), so an event costs the workers it reads,
not the fleet. (The heap and the clock are imported as names, not read as module attributes:
compiled, a module's attribute is looked up in Python's own way, at every event.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from time import perf_counter
from typing import Any, Final

from tropical.core.latency.model import LatencyModel
from tropical.core.metrics import attains, ttft
from tropical.core.request import Request
from tropical.sched.batching import Batch
from tropical.sched.cluster import Booking, Cluster, Effect, Fail, Migrate, Wake
from tropical.sched.lag import Lag
from tropical.sched.policy import Policy
from tropical.sched.worker import WorkerState
from tropical.sim.decode_run import DecodeRun
from tropical.sim.event import Event

_ITER_END: Final = 0
_MIGRATED: Final = 1


@dataclass(slots=True)
class Flight:
    """What a worker is executing: one batch, or a closed-form run of decode iterations from
    ``start``, of which the first ``booked`` are booked (one per iteration or run: a written
    constructor, see BatchShape)."""

    start: float
    end: float
    version: int
    batch: Batch
    run: DecodeRun | None = None
    booked: int = 0

    def __init__(self, start: float, end: float, version: int, batch: Batch,
                 run: DecodeRun | None = None) -> None:
        self.start = start
        self.end = end
        self.version = version
        self.batch = batch
        self.run = run
        self.booked = 0


@dataclass(slots=True)
class WorkerStats:
    """Per-worker accounting for reports; ``prefill_busy``: the seconds of iterations that
    computed prompt tokens (``prefill_tokens`` over it is how fast the worker prefills while it
    does, which a multiplexing worker's TPOT-sized chunks slow)."""

    busy: float = 0.0
    prefill_busy: float = 0.0
    iterations: int = 0
    prefill_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    loaded_tokens: int = 0

    @property
    def prefill_rate(self) -> float:
        """Prompt tokens computed per second of the iterations that computed them (0: none)."""
        return self.prefill_tokens / self.prefill_busy if self.prefill_busy else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        """Cached prompt tokens over prompt tokens of the prompts this worker prefilled."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Simulator:
    """Replays requests through a policy on a set of workers; deterministic for its inputs.
    ``arrival_s`` and ``end_s``: the wall time of each decision the cluster made at an arrival
    and at an iteration's end (the policy's choices with the bookkeeping they read), for what a
    live router would spend per event. ``settled``: how many decode runs were booked in part to bring
    a worker up to date for a decision that read it (each is work an event costs beyond its own)."""

    def __init__(self, workers: Sequence[WorkerState], policy: Policy,
                 requests: Sequence[Request], max_context: int | None = None,
                 miss_budget: int | None = None,
                 truth: Sequence[LatencyModel] | None = None, step_by_step: bool = False) -> None:
        """``miss_budget``: stop once more requests than this have missed their SLO (a capacity
        search only needs to know the target is out of reach); the rest are marked failed.
        ``truth``: the latency models that time execution, one per worker, when the policy's
        predictors (the workers' ``latency``) are not exact. ``step_by_step``: one event per
        decode iteration, as a real worker runs them, instead of closed-form runs."""
        self.cluster = Cluster(workers, policy, max_context)
        self.workers = self.cluster.workers
        self._lag = Lag(self._catch_up, self._unbooked)
        for worker in self.workers:
            worker.lag = self._lag
        self.truth = list(truth) if truth is not None else [w.latency for w in self.workers]
        self.miss_budget = miss_budget
        self.step_by_step = step_by_step
        self.misses = 0
        self.policy = policy
        self.requests = sorted(requests, key=lambda r: (r.arrival, r.id))
        self.stats = [WorkerStats() for _ in self.workers]
        self.now = 0.0
        self._events: list[Event] = []
        self._seq = 0
        self._flights: dict[Any, Flight] = {}
        self._versions = 0
        self.arrival_s: list[float] = []
        self.end_s: list[float] = []
        self.settled = 0

    @property
    def decision_s(self) -> list[float]:
        """Every decision's wall time, arrivals' first."""
        return self.arrival_s + self.end_s

    def run(self) -> list[Request]:
        """Simulate until every request has finished or failed; returns them in arrival order."""
        arrivals = iter(self.requests)
        upcoming = next(arrivals, None)
        while (upcoming is not None or self._events) and not self._out_of_budget():
            if upcoming is not None and (not self._events or upcoming.arrival <= self._events[0].time):
                self.now = self._lag.now = upcoming.arrival
                self._arrive(upcoming)
                upcoming = next(arrivals, None)
                continue
            event = heappop(self._events)
            self.now = self._lag.now = event.time
            payload = event.payload
            if event.kind == _ITER_END:  # arguments unpacked here: compiled, a starred call is Python's own
                key, version = payload
                self._iteration_end(key, version)
            else:
                req, source, target = payload
                self._migrated(req, source, target)
        self._fail_leftovers()
        return self.requests

    def _out_of_budget(self) -> bool:
        return self.miss_budget is not None and self.misses > self.miss_budget

    def _push(self, time: float, kind: int, payload: tuple[Any, ...]) -> None:
        self._seq += 1
        heappush(self._events, Event(time, self._seq, kind, payload))

    def _next_version(self) -> int:
        """A number no flight had before (counters are ints, not ``itertools.count``: compiled,
        ``next`` on one is a call in Python's own way)."""
        self._versions += 1
        return self._versions

    def _arrive(self, req: Request) -> None:
        started = perf_counter()
        effects = self.cluster.arrive(req, self.now)
        self.arrival_s.append(perf_counter() - started)
        self._carry_out(effects)
        if req.error is None:
            self._honor_checks()

    def _run_length(self, worker: WorkerState) -> int:
        """Decode iterations to run in closed form: up to the next finish, or fewer where the
        policy wants to look sooner."""
        if self.step_by_step:
            return 1
        steps = worker.steps_to_next_finish()
        check = self.policy.check_step(worker)
        return steps if check is None else max(1, min(steps, check - worker.steps))

    def _honor_checks(self) -> None:
        """End runs early where the policy now wants to look sooner (a run's length is counted
        from the iteration in progress: reading the worker books those before it)."""
        if not self.policy.checking:
            return
        for key, flight in list(self._flights.items()):
            if flight.run is not None:
                self._cut_run(self.workers[key], self._run_length(self.workers[key]))

    def _carry_out(self, effects: list[Effect]) -> None:
        """Do what the cluster asks: wake workers, start KV transfers, fail requests (KV frees are
        the scheduling state's alone here; a refused request is a certain miss)."""
        for effect in effects:
            if isinstance(effect, Wake):
                self._wake(self.workers[effect.worker_id])
            elif isinstance(effect, Migrate):
                self._transfer(effect)
            elif isinstance(effect, Fail):
                effect.request.fail(self.now, effect.reason)
                self.misses += effect.refusal is not None

    def _wake(self, worker: WorkerState) -> None:
        """New work reached ``worker``: start it if idle, else end its decode run early."""
        if worker.key in self._flights:
            self._cut_run(worker)
        else:
            self._start(worker)

    def _start(self, worker: WorkerState) -> None:
        if worker.key in self._flights or not worker.alive:
            return
        batch = self.cluster.plan(worker.id, self.now)
        if batch is None:
            return
        version = self._next_version()
        if batch.decode_only and not batch.loaded:
            steps = 1 if batch.held else self._run_length(worker)
            run = DecodeRun.start(worker, steps, self.truth[worker.id])
            flight = Flight(self.now, self.now + run.duration, version, batch, run)
            self.cluster.expect_end(worker.id, self.now + run.iteration(1), run.iteration(1))
        else:
            duration = self.truth[worker.id].iteration_time(batch.shape) + batch.loaded * worker.host_load_s
            self.stats[worker.id].loaded_tokens += batch.loaded
            flight = Flight(self.now, self.now + duration, version, batch)
            self.cluster.expect_end(worker.id, flight.end)
        self._flights[worker.key] = flight
        self._push(flight.end, _ITER_END, (worker.key, version))

    def _unbooked(self, worker_id: int) -> int:
        """Iterations of the worker's decode run completed by now and not booked (see Lag)."""
        return self._due(self._flights.get(self.workers[worker_id].key))

    def _due(self, flight: Flight | None) -> int:
        """Iterations of ``flight``'s decode run completed by now and not booked."""
        if flight is None or flight.run is None:
            return 0
        return max(0, flight.run.completed_by(self.now - flight.start) - flight.booked)

    def _catch_up(self, worker_id: int) -> None:
        """Book the iterations of the worker's decode run completed by now, short of the run's
        last (its iteration end books that), when a decision reads the worker (see Lag; a run
        whose next iteration the clock has not quite passed waits for the next read)."""
        flight = self._flights.get(self.workers[worker_id].key)
        unbooked = self._due(flight)
        if not unbooked:
            return
        assert flight is not None and flight.run is not None
        run = flight.run
        done = flight.booked + unbooked
        self.settled += 1
        self.cluster.advance(worker_id, done - flight.booked, flight.start + run.elapsed(done),
                             run.iteration(flight.booked + 1), run.growth)
        flight.booked = done
        self.cluster.expect_end(worker_id, flight.start + run.elapsed(done + 1), run.iteration(done + 1))

    def _cut_run(self, worker: WorkerState, steps: int | None = None) -> None:
        """Shorten a decode run: to ``steps`` iterations, or else to end at the first iteration
        boundary from now."""
        flight = self._flights.get(worker.key)
        if flight is None or flight.run is None or flight.run.steps == flight.booked + 1:
            return
        whole, ahead = flight.run, flight.booked + 1
        run = whole.cut_at(self.now - flight.start) if steps is None else whole.cut_to(flight.booked + steps)
        if run.steps < ahead:
            run = whole.cut_to(ahead)
        if run.steps >= whole.steps:
            return
        flight.run, flight.end, flight.version = run, flight.start + run.duration, self._next_version()
        self._push(flight.end, _ITER_END, (worker.key, flight.version))

    def _iteration_end(self, key: Any, version: int) -> None:
        """The iteration in flight on the worker whose ``key`` the event holds has ended, unless
        its flight was cut since (another ``version``). Flights are kept by the workers' keys:
        compiled, an int id past 256 is boxed anew at every dict access (by ids, this and
        ``_start`` boxed 1.4 million over 8,000 requests at 1,024 workers; by keys, 0.2 million,
        counted with callgrind)."""
        flight = self._flights.get(key)
        if flight is None or flight.version != version:
            return
        del self._flights[key]
        worker_id: int = key
        stats = self.stats[worker_id]
        stats.busy += flight.end - flight.start
        run = flight.run
        stats.iterations += 1 if run is None else run.steps
        steps, first, growth = ((1, 0.0, 0.0) if run is None else
                                (run.steps - flight.booked, run.iteration(flight.booked + 1), run.growth))
        if run is None and flight.batch.prefills:
            stats.prefill_tokens += sum(new for _, new, _ in flight.batch.prefills)
            stats.prefill_busy += flight.end - flight.start
        started = perf_counter()
        booking = self.cluster.book(worker_id, flight.batch, self.now, steps, first=first, growth=growth)
        self.end_s.append(perf_counter() - started)
        for req in booking.prefilled:
            stats.prompt_tokens += req.prompt_len
            stats.cached_tokens += req.reused
        if booking.prefilled or booking.finished:
            self._count_misses(booking)
        if booking.effects:
            self._carry_out(booking.effects)
        if self.policy.observes_iterations:
            self._honor_checks()
        self._start(self.workers[worker_id])

    def _count_misses(self, booking: Booking) -> None:
        """A late first token is a certain miss; a request finished on time may still miss TPOT."""
        self.misses += sum(ttft(r) > r.slo.ttft for r in booking.prefilled)
        self.misses += sum(ttft(r) <= r.slo.ttft and not attains(r)
                           for r, _ in booking.finished)

    def _transfer(self, move: Migrate) -> None:
        req = move.request
        req.migrated_tokens = move.tokens
        req.migration_time = self.truth[move.source].transfer_time(move.tokens)
        self._push(self.now + req.migration_time, _MIGRATED, (req, move.source, move.target))

    def _migrated(self, req: Request, source_id: int, target_id: int) -> None:
        self._carry_out(self.cluster.migrated(req, source_id, target_id))

    def _fail_leftovers(self) -> None:
        reason = ("not simulated: the miss budget was exhausted" if self._out_of_budget()
                  else "never scheduled: the cluster could not make room for it")
        for req in self.requests:
            if not req.done:
                req.fail(self.now, reason)
