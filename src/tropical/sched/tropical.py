"""The multiplexing toggle (DESIGN.md §2): SLO-aware choice between two prefill paths.

Path 1 sends a prefill to the dedicated prefill worker with the earliest predicted finish when
that meets the request's TTFT SLO. When it would not (TTFT at risk), Path 2 lets a multiplexing
worker run the prefill in its next iteration if the stretched iteration keeps every decoding
request within its TPOT slack and KV stays under the watermark; the request then decodes there.
Otherwise the request falls back to Path 1's best choice. Requests still queued on prefill
workers are re-examined at every iteration end, shortest prompts first, and moved to Path 2 once
their TTFT is at risk and some multiplexing worker has the slack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

from tropical.core.latency.model import prefill_time
from tropical.core.latency.shape import BatchShape
from tropical.core.request import Path, Request
from tropical.sched.baselines import split_roles
from tropical.sched.policy import Assignment, Policy
from tropical.sched.prediction import free_at
from tropical.sched.rules import BatchRules, Role
from tropical.sched.slack import Decoding, SlackRule, fits_tpot
from tropical.sched.worker import WorkerState


@dataclass(frozen=True, slots=True)
class ToggleParams:
    """The toggle's knobs: role split, KV watermark, slack rule, how deep to look for risk, and
    whether requests that will miss their TTFT even if started now yield their place."""

    num_prefill: int | None = None
    watermark: float = 0.9
    slack: SlackRule = SlackRule.ITERATION
    lookahead: int = 64
    demote_doomed: bool = False


class TropicalPolicy(Policy):
    """Dedicated prefill workers plus multiplexing workers, switched per request by the toggle."""

    name = "tropical"
    observes_iterations = True

    def __init__(self, max_batched_tokens: int, toggle: ToggleParams | None = None,
                 max_seqs: int = 256, max_context: int = 200_000, name: str = "tropical") -> None:
        """Prefill workers batch up to ``max_batched_tokens``; a multiplexing worker runs
        everything the toggle planned for its next iteration, up to ``max_context`` tokens."""
        self.name = name
        self.toggle = toggle or ToggleParams()
        self._prefill = BatchRules(prefill_first=True, token_budget=max_batched_tokens,
                                   max_seqs=max_seqs)
        self._multiplex = BatchRules(prefill_first=False, token_budget=max_context,
                                     max_seqs=max_seqs)
        self._at_risk = False
        self._demoted_ids: set[int] = set()

    def roles(self, num_workers: int) -> list[Role]:
        return split_roles(num_workers, self.toggle.num_prefill, Role.MULTIPLEX)

    def rules(self, role: Role) -> BatchRules:
        return self._prefill if role is Role.PREFILL else self._multiplex

    def wants_iteration_events(self) -> bool:
        """Only banked slack grows between events; per-iteration slack only shrinks as
        contexts grow, so a move infeasible at one event stays so until the next."""
        return self._at_risk and self.toggle.slack is SlackRule.BANKED

    def on_arrival(self, req: Request, now: float,
                   workers: Sequence[WorkerState]) -> list[Assignment]:
        prefill, multiplex = _split(workers)
        best, finish = self._path1(req, prefill, now)
        if best is not None and finish - req.arrival <= req.slo.ttft:
            return [Assignment(req, best.id, Path.PREFILL_WORKER,
                               f"fits TTFT SLO on prefill worker (predicted {finish - req.arrival:.3f}s)")]
        options = [(done, w.id, w) for w in multiplex
                   if (done := self._multiplex_finish(req, w, [], now)) is not None and done < finish]
        if options:
            done, _, target = min(options)
            return [self._multiplexed(req, target, finish, done)]
        if best is None:
            return [self._no_prefill_worker(req, multiplex)]
        self._at_risk = True
        return [Assignment(req, best.id, Path.FALLBACK,
                           f"TTFT at risk (predicted {finish - req.arrival:.3f}s > "
                           f"SLO {req.slo.ttft:.3f}s); no multiplexing worker had slack")]

    def on_iteration_end(self, worker: WorkerState, now: float,
                         workers: Sequence[WorkerState]) -> list[Assignment]:
        """Move queued requests whose TTFT is now at risk to multiplexing workers with slack.

        Any event may decide a move: it is priced on the target's *next* iteration, which the
        substrate starts at that worker's next boundary. Shortest prompts go first; the first
        that fits nowhere ends the round, since a longer prompt stretches an iteration (and
        needs KV) at least as much.
        """
        prefill, multiplex = _split(workers)
        at_risk = self._queued_at_risk(prefill, now)
        self._at_risk = bool(at_risk)
        hopeless = [x for x in at_risk if self._hopeless(x[0], x[1], now)]
        hopeful = [x for x in at_risk if x not in hopeless]
        return self._multiplex_at_risk(hopeful, multiplex, now) + [
            self._demoted(req, source) for req, source, _ in hopeless
            if req.id not in self._demoted_ids]

    def _multiplex_at_risk(self, at_risk: list[tuple[Request, WorkerState, float]],
                           multiplex: list[WorkerState], now: float) -> list[Assignment]:
        plans: dict[int, list[Request]] = {w.id: [] for w in multiplex}
        moves = []
        for req, source, finish in sorted(at_risk, key=lambda x: x[0].prompt_len):
            options = [(done, w.id, w) for w in multiplex
                       if (done := self._multiplex_finish(req, w, plans[w.id], now)) is not None]
            if not options:
                break
            done, _, target = min(options)
            if done < finish:
                plans[target.id].append(req)
                moves.append(self._multiplexed(req, target, finish, done, source.id))
        return moves

    def _hopeless(self, req: Request, source: WorkerState, now: float) -> bool:
        """Would ``req`` miss its TTFT even if its prefill started right now (tropical+ only)?"""
        return (self.toggle.demote_doomed
                and now + source.prefill_cost(req) - req.arrival > req.slo.ttft)

    def _demoted(self, req: Request, source: WorkerState) -> Assignment:
        """Send a hopeless request to the back of its queue so that others can still attain."""
        self._demoted_ids.add(req.id)
        return Assignment(req, source.id, Path.FALLBACK,
                          "TTFT already out of reach; yielded its place in the prefill queue",
                          source.id)

    def _path1(self, req: Request, prefill: list[WorkerState],
               now: float) -> tuple[WorkerState | None, float]:
        """The prefill worker with the earliest predicted finish for ``req``, and that finish."""
        options = [(free_at(w, now) + prefill_time(w.latency, req.prompt_len), w.id, w)
                   for w in prefill]
        if not options:
            return None, float("inf")
        finish, _, worker = min(options)
        return worker, finish

    def _queued_at_risk(self, prefill: list[WorkerState],
                        now: float) -> list[tuple[Request, WorkerState, float]]:
        """Queued requests (not yet running) whose predicted Path 1 TTFT misses the SLO.

        Only the first ``lookahead`` of each queue are examined: deeper ones get their turn as
        the queue drains, and the scan stays cheap under overload.
        """
        risky = []
        for worker in prefill:
            clock = max(now, worker.busy_until)
            for req in worker.queued(self.toggle.lookahead):
                clock += worker.prefill_cost(req)
                if clock - req.arrival > req.slo.ttft:
                    risky.append((req, worker, clock))
        return risky

    @staticmethod
    def _multiplexed(req: Request, worker: WorkerState, path1_finish: float, finish: float,
                     source: int | None = None) -> Assignment:
        return Assignment(req, worker.id, Path.MULTIPLEX,
                          f"TTFT at risk on prefill workers (predicted {path1_finish - req.arrival:.3f}s "
                          f"> SLO {req.slo.ttft:.3f}s); multiplexed, predicted {finish - req.arrival:.3f}s",
                          source)

    def _multiplex_finish(self, req: Request, worker: WorkerState, plan: list[Request],
                          now: float) -> float | None:
        """When ``worker``'s next iteration would end with ``req`` in it, or None if it may not.

        ``plan`` holds prefills already promised to that iteration in this scheduling round.
        """
        prefills = [*worker.queued(), *plan, req]
        if worker.batch_size + len(prefills) + len(worker.inbox) > worker.rules.max_seqs:
            return None
        kv_tokens = sum(worker.kv_tokens_needed(r) for r in prefills if r.id not in worker.holds)
        if not worker.kv.fits(kv_tokens, self.toggle.watermark):
            return None
        busy = worker.busy_until > now
        start = worker.busy_until if busy else now
        decodes = _next_decodes(worker, busy, start)
        iteration = worker.latency.iteration_time(_next_shape(decodes, prefills))
        if not fits_tpot(decodes, iteration, start, self.toggle.slack):
            return None
        return start + iteration

    def _no_prefill_worker(self, req: Request, multiplex: list[WorkerState]) -> Assignment:
        target = min(multiplex, key=lambda w: (w.unfinished_tokens, w.id), default=None)
        if target is None:
            raise RuntimeError("no live worker takes new requests")
        return Assignment(req, target.id, Path.FALLBACK, "no live prefill worker")


def _split(workers: Sequence[WorkerState]) -> tuple[list[WorkerState], list[WorkerState]]:
    live = [w for w in workers if w.alive]
    return ([w for w in live if w.role is Role.PREFILL],
            [w for w in live if w.role is Role.MULTIPLEX])


def _next_decodes(worker: WorkerState, busy: bool, start: float) -> list[Decoding]:
    """Who decodes in ``worker``'s next iteration: its batch (one token further if an iteration
    is in flight), KV that has landed, and prompts finishing in the iteration in flight."""
    ahead = int(busy)
    decodes = [Decoding(r, worker.generated(r) + ahead, r.first_token) for r in worker.running.values()]
    decodes += [Decoding(r, r.generated, r.first_token) for r in worker.inbox]
    if busy:
        decodes += [Decoding(r, 1, start) for r in islice(worker.waiting, worker.batch_prefills)
                    if r.computed == 0]
    return decodes


def _next_shape(decodes: list[Decoding], prefills: list[Request]) -> BatchShape:
    """The batch a multiplexing worker would run next: those decodes plus the prefills."""
    return BatchShape.of_batch([(r.remaining_prompt, r.computed) for r in prefills], len(decodes),
                               sum(d.request.prompt_len + d.generated for d in decodes))
