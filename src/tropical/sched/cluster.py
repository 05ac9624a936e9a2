"""The cluster's scheduling state and the events that change it, shared by every substrate.

A substrate owns time and execution: the simulator's event heap, the router's asyncio drivers, a
single engine worker. It tells the Cluster what happened (a request arrived, a worker is about to
run an iteration or finished one, KV landed, a client left, a worker died or came back) and carries
out the effects the Cluster returns: wake a worker, move a request's KV, free KV in a worker's cache,
fail a request. Admission, apply-then-wake, stamping the prefill start, booking an iteration,
migrate-or-stall, retrying stalled migrations and the iteration-end gate are written here once.

Workers come in two kinds. A stepped worker (the simulator's, our engine's) runs the iteration the
Cluster plans (``plan``) and reports its tokens (``book``). A self-scheduled one (a vLLM instance)
plans its own and shows only its streams: the Cluster keeps a mirror of it (``sched.mirror``),
booked from what they show (``observe``) and replanned as work reaches it (``replan``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tropical.core.request import Request
from tropical.sched.admission import Witnesses, admission_error
from tropical.sched.batching import Batch, form_batch
from tropical.sched.host_store import HostStore
from tropical.sched.load_index import LoadIndex
from tropical.sched.mirror import book_streams, unplan
from tropical.sched.policy import Assignment, Policy, apply
from tropical.sched.rejection import Refusal, arrival_refusal
from tropical.sched.rules import decodes
from tropical.sched.worker import WorkerState, worker_state

INDEXED_FROM = 512
"""Fleets at least this large keep a ``LoadIndex``. Smaller ones pass over every worker per
decision: measured side by side (benchmarks/scale.py), the index's vector calls cost more than
that pass at 64 and 256 workers and less at 1,024."""


@dataclass(slots=True, unsafe_hash=True)
class Assigned:
    """The policy placed ``request``'s prefill on ``worker_id`` (its path is on the request). A
    value: never change one (one per request; it writes its constructor, see ``BatchShape``)."""

    request: Request
    worker_id: int

    def __init__(self, request: Request, worker_id: int) -> None:
        self.request = request
        self.worker_id = worker_id


@dataclass(slots=True, unsafe_hash=True)
class Wake:
    """New work reached ``worker_id``: start an iteration if it is idle, or cut a decode run short.
    A value, as ``Assigned`` (compiled, a frozen dataclass is built through Python's own
    ``__init__``: this, ``Migrate`` and ``Free``, built for every request, were 1% of a
    full-rate ``tropical+`` run's instructions)."""

    worker_id: int

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id


@dataclass(slots=True, unsafe_hash=True)
class Migrate:
    """Move ``request``'s KV from ``source`` to ``target`` (room is reserved there), then report
    ``migrated`` (or ``migration_failed``): ``tokens`` of its prompt, those not cached on the
    target already. A value, as ``Wake``."""

    request: Request
    source: int
    target: int
    tokens: int

    def __init__(self, request: Request, source: int, target: int, tokens: int) -> None:
        self.request = request
        self.source = source
        self.target = target
        self.tokens = tokens


@dataclass(slots=True, unsafe_hash=True)
class Free:
    """Drop ``request_id``'s KV from ``worker_id``'s cache (the scheduling state already has). A
    value, as ``Wake``."""

    worker_id: int
    request_id: int

    def __init__(self, worker_id: int, request_id: int) -> None:
        self.worker_id = worker_id
        self.request_id = request_id


@dataclass(frozen=True, slots=True)
class Fail:
    """``request`` cannot be served: end it with ``reason`` (``refusal``: the admission stage
    refused it before any work, see ``sched.rejection``)."""

    request: Request
    reason: str
    refusal: Refusal | None = None


Effect = Assigned | Wake | Migrate | Free | Fail


@dataclass(slots=True)
class Booking:
    """What an iteration changed: requests that ended (with "length" or "eos"), prompts that
    completed (their first token is out), and what the substrate must do next. One per
    iteration: a written constructor (see BatchShape)."""

    finished: list[tuple[Request, str]]
    prefilled: list[Request]
    effects: list[Effect]

    def __init__(self, finished: list[tuple[Request, str]], prefilled: list[Request],
                 effects: list[Effect]) -> None:
        self.finished = finished
        self.prefilled = prefilled
        self.effects = effects


class Cluster:
    """Workers' scheduling states and the policy that places requests on them (a substrate that
    books decode runs lazily gives its workers a ``Lag``: they bring themselves up to date when
    a decision reads them)."""

    def __init__(self, workers: Sequence[WorkerState], policy: Policy,
                 max_context: int | None = None, index_from: int = INDEXED_FROM) -> None:
        self.workers = list(workers)
        self.index = LoadIndex.over(self.workers) if len(self.workers) >= index_from else None
        self.policy = policy
        self.max_context = max_context
        self.stalled: list[tuple[Request, int]] = []
        self._at: dict[int, tuple[Request, int]] = {}
        self._started: dict[int, float] = {}
        self._witnesses = Witnesses()

    def where(self, rid: int) -> int | None:
        """The worker that holds (or is about to hold) request ``rid``."""
        entry = self._at.get(rid)
        return None if entry is None else entry[1]

    def on_worker(self, worker_id: int) -> list[Request]:
        """Every request whose work or KV is on ``worker_id`` (queued, decoding, stalled, arriving)."""
        return [req for req, at in self._at.values() if at == worker_id]

    def admission_error(self, req: Request) -> str | None:
        return admission_error(req, self.workers, self.max_context, self._witnesses)

    def arrive(self, req: Request, now: float) -> list[Effect]:
        """A new request (or one re-run after its worker died): refuse it or let the policy place it."""
        error = self.admission_error(req)
        if error is not None:
            return [Fail(req, error)]
        assignments = self.policy.on_arrival(req, now, self.workers)
        refusal = arrival_refusal(self.policy.admission, req, assignments, now, self.workers,
                                  self.policy.rescue_floor)
        effects: list[Effect] = ([self._refuse(req, refusal)] if refusal is not None
                                 else self._assign(assignments))
        self._refile()
        return effects

    def _refuse(self, req: Request, refusal: Refusal) -> Fail:
        """The admission stage refused ``req``: it leaves the scheduling state (it holds nothing)."""
        self._at.pop(req.id, None)
        req.rejected = refusal.reason
        return Fail(req, f"rejected: {refusal.message}", refusal)

    def _refuse_lapsed(self, worker: WorkerState, now: float) -> list[Effect]:
        """Refuse the prompts queued on ``worker`` whose TTFT can no longer be met."""
        refused: list[Effect] = []
        for req, refusal in self.policy.admission.lapsed(worker, now):
            worker.abort(req)
            refused.append(self._refuse(req, refusal))
        return refused

    def _refile(self) -> None:
        """Bring the load index up to date with the workers this event changed, before it
        returns rather than at the next walk: every event then pays for its own changes. (Under
        a burst at 1,024 workers a migration's walk re-filed the workers changed by the dozen
        events before it, 11 on average and 74 at its P99, and took half the decision P99.)"""
        if self.index is not None:
            self.index.refile()

    def _assign(self, assignments: Sequence[Assignment]) -> list[Effect]:
        """Hand over every decision first, then wake the workers: prefills the policy planned for
        one iteration must start together. (Most iteration ends decide nothing: they build
        nothing.)"""
        if not assignments:
            return []
        assigned: list[Assigned] = []
        for a in assignments:
            self._at[a.request.id] = (a.request, apply(a, self.workers).id)
            assigned.append(Assigned(a.request, a.worker_id))
        woken = dict.fromkeys(e.worker_id for e in assigned)
        return [*assigned, *(Wake(w) for w in woken)]

    def plan(self, worker_id: int, now: float) -> Batch | None:
        """The iteration ``worker_id`` starts at ``now`` (None: nothing to run). Landed KV joins the
        decode batch first; prompts that start now get their prefill start stamped."""
        worker = self.workers[worker_id]
        worker.admit_inbox()
        batch = form_batch(worker, now)
        if batch.is_empty:
            return None
        for req, _, _ in batch.prefills:
            if req.prefill_start is None:
                req.prefill_start = now
        self._started[worker_id] = now
        return batch

    def expect_end(self, worker_id: int, until: float, pace: float = 0.0) -> None:
        """The worker's current iteration should end at ``until`` (what the policy plans around);
        ``pace``: the least any later iteration of a decode run it is in takes (see ``Lag``)."""
        worker = self.workers[worker_id]
        worker.busy_until = until
        worker.pace = pace

    def advance(self, worker_id: int, steps: int, now: float, first: float = 0.0,
                growth: float = 0.0) -> None:
        """Book ``steps`` decode iterations of a run still in flight (none of them finishes a request);
        ``first`` and ``growth`` time them, as for ``book``."""
        finished = self.workers[worker_id].advance_decodes(steps, now, first, growth)
        self._started.pop(worker_id, None)
        if finished:
            raise RuntimeError(f"worker {worker_id}: a decode run was settled past a finish")

    def book(self, worker_id: int, batch: Batch, now: float, steps: int = 1, eos: Iterable[int] = (),
             first: float = 0.0, growth: float = 0.0) -> Booking:
        """``batch`` ran (``steps`` times, for a decode-only batch) and ended at ``now``; a run of
        several took ``first`` for its first iteration and ``growth`` more for each next one (the
        requests' gaps between tokens are booked from them).

        Decodes are booked first, then prompts; requests in ``eos`` sampled an end-of-sequence
        token and stop unless a length limit finished them already. Prompts done on a worker that
        does not decode migrate; freed KV retries stalled migrations; then the policy looks.
        """
        worker = self.workers[worker_id]
        self.expect_end(worker_id, now)     # nothing in flight: no decode run to book lazily
        started = self._started.pop(worker_id, None)
        if started is not None and worker.learns:
            worker.learn(batch.shape, first if steps > 1 else now - started, steps)
        finished = ([(r, "length") for r in worker.advance_decodes(steps, now, first, growth)]
                    if batch.decode_count else [])
        prefilled = self._complete_prompts(worker, batch, now, finished) if batch.prefills else []
        if eos:
            finished += [(req, "eos") for req in self._stop_at_eos(worker, eos, now)]
        return self._conclude(worker, finished, prefilled, now)

    def observe(self, worker_id: int, now: float, tokens: Mapping[int, int],
                eos: Iterable[int] = ()) -> Booking:
        """A self-scheduled worker (one that plans its own iterations, as a vLLM instance does)
        streamed ``tokens`` by ``now`` (request id: its tokens there so far); requests in ``eos``
        ended there before their length. Its mirror books what that implies (``sched.mirror``)
        and plans the iteration it is running now; then, as after ``book``: frees, migrations,
        stalled migrations retried, and the policy's look."""
        worker = self.workers[worker_id]
        streamed = [(self._at[rid][0], n) for rid, n in tokens.items() if self.where(rid) == worker_id]
        finished, prefilled = book_streams(worker, streamed, now, self._started.get(worker_id, now))
        ended = [rid for rid in eos if self.where(rid) == worker_id]
        finished += [(req, "eos") for req in self._stop_at_eos(worker, ended, now)]
        self.replan(worker_id, now)
        return self._conclude(worker, finished, prefilled, now)

    def replan(self, worker_id: int, now: float) -> None:
        """The iteration a self-scheduled worker runs from ``now``, as far as its mirror can tell
        (what ``plan`` would give it), predicted to end one iteration later."""
        worker = self.workers[worker_id]
        unplan(worker)
        batch = self.plan(worker_id, now)
        self._started[worker_id] = now
        worker.busy_until = now + (worker.latency.iteration_time(batch.shape) if batch else 0.0)

    def _conclude(self, worker: WorkerState, finished: list[tuple[Request, str]], prefilled: list[Request],
                  now: float) -> Booking:
        """After an iteration's booking: free what finished, migrate prompts done on a worker that
        does not decode, retry stalled migrations if KV was freed, then let the policy look (and
        the load index take in what changed)."""
        worker_id = worker.id
        effects: list[Effect] = []
        for req, _ in finished:
            del self._at[req.id]
            effects.append(Free(worker_id, req.id))
        if not decodes(worker.role):
            for req in prefilled:
                if req.finish is None:
                    effects += self._migrate(req, worker_id, now)
        if finished and self.stalled:
            effects += self._retry_stalled(now)
        if self.policy.observes_iterations:
            effects += self._assign(self.policy.on_iteration_end(worker, now, self.workers))
        effects += self._refuse_lapsed(worker, now)
        self._refile()
        return Booking(finished, prefilled, effects)

    @staticmethod
    def _complete_prompts(worker: WorkerState, batch: Batch, now: float,
                          finished: list[tuple[Request, str]]) -> list[Request]:
        """Book the batch's prompt spans; the prompts they completed (a one-token request also
        finishes, into ``finished``)."""
        prefilled = []
        for req, new, _ in batch.prefills:
            if worker.complete_prefill(req, new, now):
                prefilled.append(req)
                if req.finish is not None:
                    finished.append((req, "length"))
        return prefilled

    def _stop_at_eos(self, worker: WorkerState, rids: Iterable[int], now: float) -> list[Request]:
        """End requests early: abort frees their KV and drops them from the decode batch (they
        keep ``generated`` as booked so far); they finish now like a normal finish."""
        stopped = []
        for rid in rids:
            req = self._at[rid][0]
            if req.finish is None:
                worker.abort(req)
                req.finish = now
                stopped.append(req)
        return stopped

    def _migrate(self, req: Request, source_id: int, now: float) -> list[Effect]:
        """Pick a decoding worker with room for a prefilled request, or stall it until one frees KV."""
        target = self.policy.decode_worker(req, self.workers, now)
        if target is not None:
            tokens = target.expect_migration(req)
            self._at[req.id] = (req, target.id)
            return [Migrate(req, source_id, target.id, tokens)]
        if any(w.alive and decodes(w.role) for w in self.workers):
            self.stalled.append((req, source_id))
            return []
        return self._drop(req, source_id, "no live worker is left to decode it")

    def _retry_stalled(self, now: float) -> list[Effect]:
        stalled, self.stalled = self.stalled, []
        return [e for req, source_id in stalled for e in self._migrate(req, source_id, now)]

    def migrated(self, req: Request, source_id: int, target_id: int) -> list[Effect]:
        """``req``'s KV landed on ``target_id``: the source frees it, and the request joins the
        target's batch at its next boundary, unless it was aborted on the way."""
        source, target = self.workers[source_id], self.workers[target_id]
        source.release(req)
        if req.id not in target.incoming:
            return [Free(source_id, req.id), Free(target_id, req.id), Wake(source_id)]
        target.arrive_migrated(req)
        return [Free(source_id, req.id), Wake(target_id), Wake(source_id)]

    def migration_failed(self, req: Request, source_id: int, target_id: int, reason: str) -> list[Effect]:
        """The KV move broke: free what either side holds and fail the request."""
        self.workers[target_id].abort(req)
        return [Free(target_id, req.id), Wake(target_id), *self._drop(req, source_id, reason)]

    def _drop(self, req: Request, worker_id: int, reason: str) -> list[Effect]:
        self.workers[worker_id].abort(req)
        if self._at.get(req.id, (None,))[0] is req:
            del self._at[req.id]
        return [Free(worker_id, req.id), Wake(worker_id), Fail(req, reason)]

    def abort(self, rid: int, now: float) -> list[Effect]:
        """The client left: drop the request wherever it is (call between the iterations of the
        worker that holds it); the KV it frees may let queued prompts and stalled migrations run."""
        entry = self._at.pop(rid, None)
        if entry is None:
            return []
        req, worker_id = entry
        self.stalled = [(r, s) for r, s in self.stalled if r.id != rid]
        landed = req.id not in self.workers[worker_id].incoming or req in self.workers[worker_id].inbox
        self.workers[worker_id].abort(req)
        effects: list[Effect] = [Free(worker_id, rid)] if landed else []
        return effects + [Wake(worker_id), *self._retry_stalled(now)]

    def worker_died(self, worker_id: int, now: float) -> tuple[list[Request], list[Effect]]:
        """Take a dead worker out of the policy's view; returns the requests it took with it, and
        what retrying the stalled migrations without it does (with no decoder left, they fail)."""
        self.workers[worker_id].alive = False
        self.workers[worker_id].changed()
        self.policy.roster_changed()
        lost = self.on_worker(worker_id)
        for req in lost:
            del self._at[req.id]
        self.stalled = [(r, s) for r, s in self.stalled if s != worker_id]
        return lost, self._retry_stalled(now)

    def worker_revived(self, worker_id: int, now: float) -> list[Effect]:
        """A restarted worker serves again with an empty cache: a fresh state under its old role,
        rules, latency and cache size; stalled migrations may now find room on it."""
        old = self.workers[worker_id]
        directory = old.kv.cache.directory if old.kv.cache is not None else None
        if directory is not None:
            directory.drop_worker(worker_id)
        self.workers[worker_id] = worker_state(worker_id, old.role, old.rules, old.kv.capacity_blocks,
                                               old.kv.block_size, old.latency, old.kv.cache is not None,
                                               directory)
        self.workers[worker_id].lag = old.lag
        store = old.kv.cache.host if old.kv.cache is not None else None
        if store is not None:            # its own store died with it; a shared one lives on
            self.workers[worker_id].add_host_tier(store if store.shared else HostStore(store.capacity),
                                                  old.host_load_s)
        if self.index is not None:
            self.index.watch(self.workers[worker_id])
        self.policy.roster_changed()
        return self._retry_stalled(now)
