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

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Final

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape
from tropical.core.request import PrefillPath, Request
from tropical.sched.baselines import split_roles
from tropical.sched.chunk import Chunk, Lineup
from tropical.sched.dispatch import (
    by_cost,
    by_load,
    cheapest,
    cheapest_of,
    decode_destination,
    fewest_unfinished,
    first_fitting,
    has_room,
    least_bound_first,
    least_loaded_first,
    least_loaded_of,
    least_work,
    with_workers,
)
from tropical.sched.load_index import ascending, fleet_index
from tropical.sched.next_iteration import NextIteration
from tropical.sched.path2_floors import chunked_floors
from tropical.sched.path2_prices import Path2Prices
from tropical.sched.pending import Pending
from tropical.sched.placement import placed_choice
from tropical.sched.policy import Assignment, Policy
from tropical.sched.prediction import free_at, prompt_floor_vector, prompt_floors
from tropical.sched.queue_watch import QueueWatch
from tropical.sched.roles import RoleSwitch
from tropical.sched.rules import LATEST_START, BatchRules, Role, check_piece, check_size_weight, decodes
from tropical.sched.slack import Decoding, SlackRule
from tropical.sched.tightest import TightestPrompt
from tropical.sched.worker import WorkerState
from tropical.sched.worker_views import WorkerViews

SHORTLIST: Final = 4
"""Multiplexing workers Path 2 prices per request: all of them up to this many; beyond, the
ones with the least work once they took it (their prefix cache's hit counted), so that a
decision costs the same at a thousand workers as at a few (pricing a worker plans its next
iteration: the scan the toggle cannot afford per worker at scale). Four rather than eight or
sixteen: ``benchmarks/shortlist.py`` sets sizes side by side (decision times under a burst,
attainment near capacity at 64 to 1,024 workers), and ``tropical sweep --shortlist`` their
capacities at 16 to 256 workers, where four served as many requests as eight or more in every
cell measured (docs/scaling.md)."""


@dataclass(frozen=True, slots=True)
class ToggleParams:
    """The toggle's knobs: role split, KV watermark, slack rule, how deep to look for risk,
    whether requests that will miss their TTFT even if started now yield their place
    (``demote_doomed``; None: the policy's default, off for the paper's toggle and on for
    ``tropical+``, see ``registry``), and whether multiplexing workers take prompts in
    slack-sized chunks over several iterations,
    and whether prefill queues are ordered by laxity (least TTFT slack first; under chunked
    multiplexing the multiplexing workers' queues too, where a chunk boundary lets an urgent
    prompt go ahead of one with slack to spare), and whether Path 1 takes the baselines'
    dispatch (fewest unfinished tokens) instead of the earliest predicted finish, and whether
    each worker's predictions are corrected online from the iterations it runs, and whether
    idle prefill workers lend themselves to the multiplexing side (``flex``, see roles.py), and
    whether the baselines' dispatch also counts the prompt tokens a worker would compute, its
    own prefix cache's hit left out (``cache_aware``; Path 1's predicted finish and Path 2's
    always price a prompt less the hit on each worker), and whether Path 2 spends the decodes'
    banked slack (``burst``: a prompt goes to Path 2 only when the prefill workers cannot clear
    it within its TTFT SLO, a burst; it may then stretch an iteration past the tightest TPOT SLO
    as long as every decode there still keeps tokens x TPOT SLO since its first token, the
    banked rule, while plain decodes keep the per-iteration rule), and how many prompt tokens a
    prefill worker batches per iteration (``prefill_budget``; None: the policy's default,
    ``max_batched_tokens`` for the paper's toggle; a lone prompt may exceed it, so a small
    budget runs long prompts one at a time in queue order, as the k-server bound does, and a
    short urgent prompt waits for one prompt, not a batch), and whether a multiplexing worker's
    iteration that finishes a prompt leaves out a later prompt's chunk that would make the
    finished one miss its TTFT SLO (``spare_finishing``; None: the policy's default, on for
    ``tropical+``; Path 2's finish is priced so, each prompt's last iteration only as long as
    its own work, see ``Chunk.finish``), and how many multiplexing workers Path 2 prices per
    request in a fleet with more of them (``shortlist``, see ``SHORTLIST``), and whether Path 1
    sends a prompt where it would finish soonest at its place in the prefill queue's order
    (``placed_dispatch``; None: the policy's default, on for ``tropical+``; see ``placement``:
    the finish checked against the TTFT SLO stays the one behind that worker's whole queue), and
    how much a prompt's own predicted prefill weighs in its queue key under laxity order
    (``size_weight``, see ``BatchRules``; None: the policy's default, -1 for the paper's toggle,
    its latest start, and ``PLUS_SIZE_WEIGHT`` for ``tropical+``), and how long a piece a
    prefill worker cuts a longer prompt into (``prefill_piece``, see ``BatchRules.piece_tokens``;
    None: the policy's default, whole prompts for the paper's toggle and ``PLUS_PREFILL_PIECE``
    tokens for ``tropical+``; 0: whole), and whether an arriving prompt takes Path 2 at once only
    where no shorter prompt at risk waits in the prefill queues (``shorter_first``; None: the
    policy's default, on for ``tropical+``; else it queues on Path 1 and the rounds, shortest
    first, offer it Path 2), and whether a multiplexing iteration that carries prompt chunks
    also ends within what the tightest TTFT SLO seen leaves (``iteration_cap``; None: the
    policy's default, on for ``tropical+``; see ``tightest``: under a loose TPOT SLO the
    shortest prompts otherwise find no worker that can start them in time), and whether Path 2
    prices a multiplexing worker's chunks beside the decodes that the prompts it has taken
    become there once prefilled (``joining_decodes``; None: the policy's default, on for
    ``tropical+``; else beside its decode batch as it stands: see ``_chunk_of``)."""

    num_prefill: int | None = None
    watermark: float = 0.9
    slack: SlackRule = SlackRule.ITERATION
    lookahead: int = 64
    demote_doomed: bool | None = None
    chunked: bool = False
    laxity: bool = False
    least_loaded: bool = False
    correct: bool = False
    flex: bool = False
    cache_aware: bool = True
    burst: bool = False
    prefill_budget: int | None = None
    spare_finishing: bool | None = None
    shortlist: int = SHORTLIST
    placed_dispatch: bool | None = None
    size_weight: float | None = None
    prefill_piece: int | None = None
    shorter_first: bool | None = None
    iteration_cap: bool | None = None
    joining_decodes: bool | None = None

    def __post_init__(self) -> None:
        if self.prefill_piece is not None:
            check_piece(self.prefill_piece, "prefill_piece")
        if self.shortlist < 2:
            raise ValueError(f"shortlist must be at least 2 workers, got {self.shortlist}")
        if self.prefill_budget is not None and self.prefill_budget < 1:
            raise ValueError(f"prefill_budget must be at least 1 token, got {self.prefill_budget}")
        if self.size_weight is not None:
            check_size_weight(self.size_weight)
        if not 0 <= self.watermark <= 1:
            raise ValueError(f"watermark must lie in [0, 1], got {self.watermark}")
        if self.lookahead < 1:
            raise ValueError(f"lookahead must be at least 1, got {self.lookahead}")


_BAND: Final = math.log(1.01)
_AtRisk = tuple[Request, WorkerState, float]
"""A queued request whose TTFT is at risk, the prefill worker it waits on, and its predicted
Path 1 finish there."""
_CHUNKS_KEPT: Final = 4096


@dataclass(frozen=True, slots=True)
class Roster:
    """The fleet as the toggle splits it: its live prefill and multiplexing workers, the ids of
    the latter, the prefill workers by id, and the latency model they all share (None: not
    one)."""

    fleet: Sequence[WorkerState]
    prefill: list[WorkerState]
    multiplex: list[WorkerState]
    multiplex_ids: set[int]
    prefill_by_id: dict[int, WorkerState]
    latency: LatencyModel | None

    @classmethod
    def of(cls, workers: Sequence[WorkerState]) -> Roster:
        live = [w for w in workers if w.alive]
        prefill = [w for w in live if w.role is Role.PREFILL]
        models = {id(w.latency): w.latency for w in prefill}
        multiplex = [w for w in live if w.role is Role.MULTIPLEX]
        return cls(workers, prefill, multiplex, {w.id for w in multiplex}, {w.id: w for w in prefill},
                   next(iter(models.values())) if len(models) == 1 else None)


_PREFILL: Final = (Role.PREFILL,)
_MULTIPLEX: Final = (Role.MULTIPLEX,)
FLOORS_FROM: Final = 2
"""Path 2 looks at more multiplexing workers than this in the order of their floors
(``path2_floors``). On the conversation trace the floors spared 2% of the looks at the paper
cluster's two multiplexing workers (not worth pricing them), 31% at four, 57% at eight and 75%
at a shortlist of sixteen."""


class TropicalPolicy(Policy):
    """Dedicated prefill workers plus multiplexing workers, switched per request by the toggle."""

    name = "tropical"
    observes_iterations = True
    routes_by_prefix = True

    def __init__(self, max_batched_tokens: int, toggle: ToggleParams | None = None,
                 max_seqs: int = 256, name: str = "tropical") -> None:
        """Every worker batches up to ``max_batched_tokens`` (a lone prompt may exceed it); the
        toggle plans multiplexed prefills within that budget."""
        self.name = name
        self.toggle = toggle or ToggleParams()
        weight = LATEST_START if self.toggle.size_weight is None else self.toggle.size_weight
        self._tightest = TightestPrompt() if self.toggle.iteration_cap and self.toggle.chunked else None
        self._prefill = BatchRules(prefill_first=True, max_seqs=max_seqs, laxity=self.toggle.laxity,
                                   piece_tokens=self.toggle.prefill_piece or 0,
                                   token_budget=self.toggle.prefill_budget or max_batched_tokens,
                                   size_weight=weight)
        self._multiplex = BatchRules(prefill_first=False, chunked=self.toggle.chunked,
                                     laxity=self.toggle.laxity and self.toggle.chunked, size_weight=weight,
                                     token_budget=max_batched_tokens, max_seqs=max_seqs,
                                     tpot_guard=self._path2_slack,
                                     spare_finishing=bool(self.toggle.spare_finishing),
                                     tightest=self._tightest)
        self._checks: dict[int, int] = {}
        self._chunks: dict[tuple[int, int | None, int, int], Chunk] = {}
        self._last_chunk: dict[int, int] = {}
        self._views = WorkerViews()
        self._watch = QueueWatch(self.toggle.lookahead)
        self._roles = RoleSwitch()
        self._roster: Roster | None = None
        self._prices = Path2Prices()

    def keeps_directory(self, roles: Sequence[Role]) -> bool:
        """The toggle reads the directory for the holders of a prompt's prefix among more
        multiplexing workers than Path 2 shortlists, and for floors, which spare exact prices
        only where a walk has more than ``FLOORS_FROM`` workers of a role. On the paper
        cluster's two and two it reads neither and decides alike without one, and indexing
        every block its caches store and evict cost 2-10% of a full-rate run's instructions
        (at eight workers, floors without it cost 2.5% more)."""
        multiplex = roles.count(Role.MULTIPLEX)
        return multiplex > self.toggle.shortlist or max(roles.count(Role.PREFILL), multiplex) > FLOORS_FROM

    @property
    def _path2_slack(self) -> SlackRule:
        """The slack rule a multiplexed prompt may spend: banked in bursts, else the toggle's."""
        return SlackRule.BANKED if self.toggle.burst else self.toggle.slack

    @property
    def learns_latency(self) -> bool:
        return self.toggle.correct

    def roles(self, num_workers: int) -> list[Role]:
        return split_roles(num_workers, self.toggle.num_prefill, Role.MULTIPLEX)

    def rules(self, role: Role) -> BatchRules:
        return self._prefill if role is Role.PREFILL else self._multiplex

    def check_step(self, worker: WorkerState) -> int | None:
        """Per-iteration slack only shrinks as contexts grow, so a move infeasible at one event
        stays so until the next; banked slack grows with every fast iteration, so the toggle
        asks to look again at the step where the shortest waiting prompt should fit."""
        return self._checks.get(worker.id)

    @property
    def checking(self) -> bool:
        return bool(self._checks)

    def roster_changed(self) -> None:
        self._roster = None

    def _split(self, workers: Sequence[WorkerState]) -> tuple[list[WorkerState], list[WorkerState]]:
        """The live prefill and multiplexing workers, kept while the roster stands (every event
        asks; a pass over a thousand workers per event is what the toggle cannot afford)."""
        kept = self._roster
        if kept is None or kept.fleet is not workers:
            kept = self._roster = Roster.of(workers)
            self._watch.follow(kept.prefill)
        return kept.prefill, kept.multiplex

    @property
    def _kept(self) -> Roster:
        """The roster (current: every event splits first)."""
        assert self._roster is not None
        return self._roster

    def on_arrival(self, req: Request, now: float,
                   workers: Sequence[WorkerState]) -> list[Assignment]:
        return self._noted(self._place(req, now, workers))

    def _noted(self, assignments: list[Assignment]) -> list[Assignment]:
        """Remember the workers prompts were queued on: only their prefill queues can hold
        prompts at risk (see ``QueueWatch``)."""
        self._watch.queued(a.worker_id for a in assignments)
        return assignments

    def _place(self, req: Request, now: float, workers: Sequence[WorkerState]) -> list[Assignment]:
        _, multiplex = self._split(workers)
        self._views.new_round()
        self._forget_chunks()
        if self._tightest is not None and multiplex and self._tightest.saw(req, multiplex[0].latency):
            self._chunks = {}                   # each was cut to the room the tightest left
        best, finish = self._path1(req, now)
        if best is not None and finish - req.arrival <= req.slo.ttft:
            return [Assignment(req, best.id, PrefillPath.PREFILL_WORKER,
                               f"fits TTFT SLO on prefill worker (predicted {finish - req.arrival:.3f}s)",
                               first_token=finish)]
        option, why = None, "a shorter prompt at risk goes first; Path 2 in a later round"
        if not (self.toggle.shorter_first and self._shorter_at_risk(req, now)):
            shortlist = Shortlists(self._kept, self.toggle.shortlist).of(req)
            option = self._best_option(req, shortlist, {}, now, finish)
            why = "no multiplexing worker had slack"
        if option is not None and self._worth(req, option[0], finish):
            done, _, target = option
            return [self._multiplexed(req, target, finish, done)]
        if best is None:
            return [self._no_prefill_worker(req, multiplex)]
        self._plan_checks(req, multiplex, {}, now, finish)
        return [Assignment(req, best.id, PrefillPath.FALLBACK,
                           f"TTFT at risk (predicted {finish - req.arrival:.3f}s > "
                           f"SLO {req.slo.ttft:.3f}s); {why}", first_token=finish)]

    def _shorter_at_risk(self, req: Request, now: float) -> bool:
        """Does a shorter prompt at risk, one Path 2 may still save, wait in a prefill queue?
        Then ``req`` queues on Path 1 and the next round offers Path 2 shortest first: a long
        prompt taken at its arrival would hold a multiplexing worker's room that the rounds give
        to shorter prompts first (on synthetic at TPOT 20x, where a multiplexing worker finishes
        long prompts in time, the rounds then rescued 184 prompts instead of 445)."""
        at_risk = self._watch.at_risk(self._kept.prefill_by_id, now)
        first = next(at_risk.shortest_first(False), None)
        return first is not None and first[0].prompt_len < req.prompt_len

    def on_iteration_end(self, worker: WorkerState, now: float,
                         workers: Sequence[WorkerState]) -> list[Assignment]:
        """Move queued requests whose TTFT is now at risk to multiplexing workers with slack.

        Any event may decide a move: it is priced on the target's *next* iteration, which the
        substrate starts at that worker's next boundary. Shortest prompts go first; the first
        that fits nowhere ends the round, since a longer prompt stretches an iteration (and
        needs KV) at least as much. Under chunked multiplexing with demotion so does the first
        that every worker would finish past its TTFT SLO: an overloaded cluster's queues then
        hold dozens of such prompts (without demotion they soon become doomed, and are left),
        pricing each at every iteration end took a quarter of a simulation's time at the
        trace's full rate, and stopping at the first measured no capacity lost
        (docs/overload.md). Doomed requests (they would miss their TTFT even if their prefill
        started right now, alone, so no path saves them) are tried by the paper's toggle, each
        after the others of its length; chunked multiplexing leaves them, and demotion lets
        them yield.
        """
        _, multiplex = self._split(workers)
        at_risk = self._watch.at_risk(self._kept.prefill_by_id, now)
        self._checks = {}
        self._views.new_round()
        self._forget_chunks()
        doomed_too = not self.toggle.chunked and not self.toggle.demote_doomed
        moves = self._multiplex_at_risk(at_risk.shortest_first(doomed_too), multiplex, now)
        if self.toggle.flex:
            self._roles.update(workers, now, len(moves) < at_risk.count,
                               {Role.PREFILL: self._prefill, Role.MULTIPLEX: self._multiplex})
            self.roster_changed()
        if not self.toggle.demote_doomed:
            return self._noted(moves)
        return self._noted(moves + [self._demoted(req, source) for req, source, _ in at_risk.doomed()
                                    if not req.yielded])

    def _multiplex_at_risk(self, at_risk: Iterable[_AtRisk],
                           multiplex: list[WorkerState], now: float) -> list[Assignment]:
        plans: dict[int, Pending] = {}
        moves = []
        shortlists = Shortlists(self._kept, self.toggle.shortlist)
        for req, source, finish in at_risk:
            option = self._best_option(req, shortlists.of(req), plans, now,
                                       finish if self.toggle.demote_doomed else None)
            if option is None:
                self._plan_checks(req, multiplex, plans, now, finish)
                break
            done, _, target = option
            if self._worth(req, done, finish):
                plans[target.id] = (plans.get(target.id) or self._queued_of(target, now)).plus(req, target)
                self._views.of(target, now).promise(req)
                moves.append(self._multiplexed(req, target, finish, done, source.id))
            elif self.toggle.chunked and self.toggle.demote_doomed:
                break
        return moves

    def _best_option(self, req: Request, workers: list[WorkerState], plans: dict[int, Pending],
                     now: float, worth_by: float | None) -> tuple[float, int, WorkerState] | None:
        """The earliest Path 2 finish for ``req`` among ``workers`` that may take it, with the
        worker (ties by id), or None if none may; given ``worth_by`` (a Path 1 finish), also
        None when that finish is not worth taking. Under chunked multiplexing (its slack not
        banked) a worker that takes a prompt finishes it exactly when priced before the checks
        that may refuse it (KV, seats, decode pace, the promises to the prompts behind it), so
        workers are checked in the order of that finish and only up to the first that takes
        it (pricing every worker in full was most of the cost of a thousand workers' arrivals,
        and of an overloaded cluster's rounds over prompts that no worker would take in time)."""
        if not self.toggle.chunked or self.toggle.burst:
            options = [(done, w.id, w) for w in workers
                       if (done := self._multiplex_finish(req, w, plans.get(w.id), now)) is not None]
            return min(options) if options else None
        for finish, _, worker in self._by_first_look(req, workers, plans, now, worth_by):
            if worth_by is not None and not self._worth(req, finish, worth_by):
                return None
            done = self._multiplex_finish(req, worker, plans.get(worker.id), now)
            if done is not None:
                return done, worker.id, worker
        return None

    def _by_first_look(self, req: Request, workers: list[WorkerState], plans: dict[int, Pending],
                       now: float, worth_by: float | None) -> Iterator[tuple[float, int, WorkerState]]:
        """``workers`` by ``_first_look`` (ties by id), each looked at only once no worker looked
        at before it could come first (``chunked_floors``; all of them where there are none or
        they are too few to save a look). Given ``worth_by``, those whose floor is already not
        worth taking are left out: their finish is not either, and the caller stops at the first
        that is not (under a burst most prompts a round reads are such on every worker)."""
        floor = chunked_floors(req, workers, now) if len(workers) > FLOORS_FROM else None
        within_slo = worth_by is not None
        if floor is None:
            return iter(sorted((self._first_look(req, w, plans, now, within_slo), w.id, w) for w in workers))
        bounded = [(floor(w), w.id, w) for w in workers]
        if worth_by is not None:
            bounded = [b for b in bounded if self._worth(req, b[0], worth_by)]
        return by_cost(least_bound_first(bounded), lambda w: self._first_look(req, w, plans, now, within_slo))

    def _first_look(self, req: Request, worker: WorkerState, plans: dict[int, Pending], now: float,
                    within_slo: bool) -> float:
        """``req``'s finish on ``worker`` before the checks: its kept price where one holds
        (inf if the worker refused it), else ``_unchecked_finish``."""
        if worker.id not in plans and not worker.learns:
            kept = self._prices.kept(req, worker, now)
            if kept is not None:
                return math.inf if kept.finish is None else kept.finish
        return self._unchecked_finish(req, worker, now, within_slo)

    def _unchecked_finish(self, req: Request, worker: WorkerState, now: float, within_slo: bool) -> float:
        """``_chunked_finish`` before its checks: inf where no chunk fits, and where the checks
        would refuse ``req`` for what a look reads anyway: no seat or KV for its prompt alone
        (``_refuses_alone``; at the paper cluster's full trace rate three looks in ten), or a prompt
        it covers already refused by the worker's lineup (``Lineup.refused``; under a burst most
        of a full walk's workers). A worker that refuses is passed over whatever its price, so
        pricing it last decides the same. Given ``within_slo`` (the caller takes no finish past
        the TTFT SLO, nor any worker after one), a prompt that alone would finish past it gets
        that floor, not its place in the lineup: under a monotone latency model its finish
        behind the prompts ahead is no sooner (at the paper cluster's full trace rate a sixth of
        the looks, a third of them the only reason to line up the worker's queue)."""
        own = Pending().plus(req, worker)
        if self._refuses_alone(worker, own):
            return math.inf
        nxt = self._next_of(worker, now)
        chunk = self._chunk_of(worker, nxt, min(nxt.min_tpot, req.slo.tpot), now)
        if chunk.tokens == 0:
            return math.inf
        if within_slo and worker.latency.monotone:
            alone = chunk.finish(worker, own, nxt.start)
            if alone - req.arrival > req.slo.ttft:
                return alone
        lineup = self._lineup_of(worker, now)
        ahead = lineup.place(req)
        if lineup.refused(chunk, nxt.start, own, ahead):
            return math.inf
        return chunk.finish(worker, lineup.prefix(ahead).merged(own), nxt.start)

    def _refuses_alone(self, worker: WorkerState, own: Pending) -> bool:
        """Would ``worker`` refuse a prompt with sums ``own`` even were nothing else queued
        there (no seat, or no KV under the watermark)? Then it refuses it behind its queue too."""
        return not self._room_for(worker, own)

    def _worth(self, req: Request, done: float, path1_finish: float) -> bool:
        """Is Path 2's predicted finish worth taking? The paper's toggle: sooner than Path 1.
        Chunked multiplexing also asks that it meet the TTFT SLO: a multiplexing worker's slack
        is spent only on prompts it can still save."""
        return done < path1_finish and (not self.toggle.chunked or done - req.arrival <= req.slo.ttft)

    def _demoted(self, req: Request, source: WorkerState) -> Assignment:
        """Send a hopeless request to the back of its queue so that others can still attain."""
        return Assignment(req, source.id, PrefillPath.FALLBACK,
                          "TTFT already out of reach; yielded its place in the prefill queue",
                          source.id, yields=True)

    def _plan_checks(self, req: Request, multiplex: list[WorkerState],
                     plans: dict[int, Pending], now: float, path1_finish: float) -> None:
        """Under banked slack, note the decode step at which ``req`` should fit each worker."""
        if self._path2_slack is not SlackRule.BANKED or (self.toggle.burst and self.toggle.chunked):
            return
        for worker in multiplex:
            plan = plans.get(worker.id) or self._queued_of(worker, now)
            step = self._fitting_step(req, worker, plan, now, path1_finish)
            if step is not None:
                self._checks[worker.id] = min(step, self._checks.get(worker.id, step))

    def _fitting_step(self, req: Request, worker: WorkerState, plan: Pending, now: float,
                      path1_finish: float) -> int | None:
        """The worker's decode step after which its banked slack should admit ``req``, or None
        if it never will before Path 1 would finish it (or for want of KV or seats)."""
        nxt = self._next_of(worker, now)
        prefills = plan.plus(req, worker)
        if not self._room_for(worker, prefills):
            return None
        shape = prefills.with_decodes(nxt.decode_count, nxt.decode_context)
        iteration = worker.latency.iteration_time(shape) + prefills.loads
        step = worker.latency.iteration_time(nxt.shape([]))
        wait = 0
        for d in nxt.decodes:
            deficit = nxt.start + iteration - d.first_token - d.generated * d.request.slo.tpot
            if deficit > 0:
                gain = d.request.slo.tpot - step
                if gain <= 0:
                    return None
                wait = max(wait, math.ceil(deficit / gain))
        if nxt.start + wait * step + iteration >= path1_finish:
            return None
        return worker.steps + int(nxt.busy) + max(wait, 1)

    def _path1(self, req: Request, now: float) -> tuple[WorkerState | None, float]:
        """The prefill worker with the earliest predicted finish for ``req`` (or, given the
        baselines' dispatch, the one with the fewest unfinished tokens; given placed dispatch,
        the earliest finish at its place in the queue), and that finish behind its whole queue."""
        if not self.toggle.least_loaded and not self.toggle.placed_dispatch:
            best = earliest_finish(req, self._kept, now)
            return (None, math.inf) if best is None else best
        kept = self._kept
        if self.toggle.placed_dispatch:
            placed = placed_choice(req, kept.prefill, kept.fleet, kept.latency, now, self.toggle.lookahead,
                                   self.toggle.shortlist // 2)      # two rankings: as many as Path 2 prices
            return (None, math.inf) if placed is None else (placed[0], free_at(placed[0], now) + placed[1])
        if self.toggle.cache_aware:
            chosen = least_work(req, kept.fleet, _PREFILL, kept.prefill)
        else:
            chosen = least_loaded_of(kept.fleet, _PREFILL)
        if chosen is None:
            return None, math.inf
        return chosen, free_at(chosen, now) + chosen.prefill_estimate(req)

    @staticmethod
    def _multiplexed(req: Request, worker: WorkerState, path1_finish: float, finish: float,
                     source: int | None = None) -> Assignment:
        return Assignment(req, worker.id, PrefillPath.MULTIPLEX,
                          f"TTFT at risk on prefill workers (predicted {path1_finish - req.arrival:.3f}s "
                          f"> SLO {req.slo.ttft:.3f}s); multiplexed, predicted {finish - req.arrival:.3f}s",
                          source, first_token=finish)

    def _multiplex_finish(self, req: Request, worker: WorkerState, plan: Pending | None,
                          now: float) -> float | None:
        """When ``worker`` would finish ``req``'s prompt, or None if it may not take it.

        ``plan`` sums the prompts queued there and those promised in this scheduling round
        (None: just the queue). The paper's toggle runs the whole prompt in the next
        iteration; chunked multiplexing runs it, after the prompts ahead of it, in the largest
        chunk each iteration's slack admits. A price against the worker's queue alone is kept
        between decisions while it holds (``Path2Prices``), unless the worker's predictions
        learn online.
        """
        if worker.id in self._roles.returning:
            return None
        if plan is not None or worker.learns:
            return self._priced(req, worker, plan, now)
        return self._prices.price(req, worker, now, lambda: self._priced(req, worker, None, now))

    def _priced(self, req: Request, worker: WorkerState, plan: Pending | None, now: float) -> float | None:
        """``_multiplex_finish`` computed (the candidate's own sums taken once, for the checks on
        the whole queue and for the chunked finish)."""
        nxt = self._next_of(worker, now)
        own = Pending().plus(req, worker)
        prefills = (plan or self._queued_of(worker, now)).merged(own)
        if not self._room_for(worker, prefills):
            return None
        if self.toggle.chunked:
            limit = min(nxt.min_tpot, req.slo.tpot)
            if not self._decodes_fit(worker, nxt, prefills, limit):
                return None
            banked = self._banked_finish(req, worker, nxt, limit, own, now) if self.toggle.burst else None
            return banked if banked is not None else self._chunked_finish(req, worker, nxt, limit, own, now)
        shape = prefills.with_decodes(nxt.decode_count, nxt.decode_context)
        iteration = worker.latency.iteration_time(shape) + prefills.loads
        if not nxt.fits(iteration, self._path2_slack):
            return None
        return nxt.start + iteration

    @staticmethod
    def _decodes_fit(worker: WorkerState, nxt: NextIteration, prefills: Pending, limit: float) -> bool:
        """Would plain decode iterations, with these prompts decoding there too and every
        request at its longest context, stay within ``limit``? (The TPOT promise covers them.)"""
        shape = BatchShape.decode(nxt.decode_count + prefills.count, nxt.peak_context + prefills.peak)
        return worker.latency.iteration_time(shape) <= limit

    def _chunked_finish(self, req: Request, worker: WorkerState, nxt: NextIteration,
                        limit: float, own: Pending, now: float) -> float | None:
        """When ``req``'s prompt (its sums there ``own``) would be done on ``worker`` fed in
        chunks behind the prompts it waits for, each iteration at most ``limit`` long (the
        tightest TPOT SLO among its decodes as they stand now and the request's own, which
        decodes there next); None if no chunk fits or it would cost a prompt behind it its TTFT
        SLO."""
        chunk = self._chunk_of(worker, nxt, limit, now)
        if chunk.tokens == 0:
            return None
        lineup = self._lineup_of(worker, now)
        ahead = lineup.place(req)
        if not lineup.keeps_promises(chunk, nxt.start, own, ahead):
            return None
        return chunk.finish(worker, lineup.prefix(ahead).merged(own), nxt.start)

    def _banked_finish(self, req: Request, worker: WorkerState, nxt: NextIteration,
                       limit: float, own: Pending, now: float) -> float | None:
        """When ``req``'s prompt would be done on ``worker`` fed in chunks larger than
        ``limit`` allows, spending the decodes' banked slack (no iteration longer than the
        request's TBT SLO, the longest gap its stream may show); None if they have none beyond
        ``limit`` or the prompt would outlast it (each iteration past the per-iteration rule
        spends what a decode saved, and each token banks one TPOT SLO more)."""
        bank = min(nxt.budget.limit(nxt.start, SlackRule.BANKED), req.slo.tbt)
        if not limit < bank < math.inf:
            return None
        done = self._chunked_finish(req, worker, nxt, bank, own, now)
        if done is None:
            return None
        steps = math.ceil((done - nxt.start) / self._chunk_of(worker, nxt, bank, now).iteration - 1e-9)
        return done if done - nxt.start <= bank + (steps - 1) * nxt.min_tpot else None

    def _chunk_of(self, worker: WorkerState, nxt: NextIteration, limit: float, now: float) -> Chunk:
        """The largest fresh prompt chunk an iteration of ``worker`` of at most ``limit`` admits
        beside its decodes and, under ``joining_decodes``, every prompt it has taken as a decode
        too (``WorkerView.joining_now``), and within the room the tightest TTFT SLO seen leaves,
        as its batches form (see ``tightest``); once per decode batch and 1% band of limits
        (priced at the band's floor, the safe side), so candidates with slightly different SLOs
        share it. Its search starts from the worker's last chunk: a decode batch grows a little
        between two of them.

        A prompt queued on a multiplexing worker decodes there once prefilled, so the iterations
        that feed a later prompt carry those decodes. Priced beside the decode batch as it
        stood, half of the prompts moved to Path 2 at the conversation trace's rate scale 0.7
        had their first token later than predicted, a tenth by more than 3.6 s, and 223 missed
        the TTFT SLO that their prediction met."""
        count, context = self._views.of(worker, now).joining_now() if self.toggle.joining_decodes else (0, 0)
        count += nxt.decode_count
        context += nxt.decode_context
        band = math.floor(math.log(limit) / _BAND) if 0 < limit < math.inf else None
        key = (worker.id, band, count, context)
        chunk = self._chunks.get(key)
        if chunk is None:
            floor = limit if band is None else math.exp(band * _BAND)
            decode = BatchShape.decode(count, context)
            if self._tightest is not None:
                floor = self._tightest.room(worker.latency, decode, floor)
            chunk = self._chunks[key] = Chunk.of(worker, decode, floor, self._last_chunk.get(worker.id, 0))
            self._last_chunk[worker.id] = chunk.tokens
        return chunk

    def _forget_chunks(self) -> None:
        """Chunks are kept per decode batch, which many decisions share (arrivals within one
        iteration); they go when predictions may have moved (online correction) or pile up."""
        if self.toggle.correct or len(self._chunks) > _CHUNKS_KEPT:
            self._chunks = {}

    def _next_of(self, worker: WorkerState, now: float) -> NextIteration:
        """The worker's next iteration as it stands (see ``WorkerViews``)."""
        return self._views.of(worker, now).next

    def _lineup_of(self, worker: WorkerState, now: float) -> Lineup:
        """The prompts queued on and promised to ``worker`` in this scheduling round, lined up
        for placing a candidate among them (kept until a promise changes them)."""
        return self._views.of(worker, now).lineup_now(self.toggle.laxity)

    def _queued_of(self, worker: WorkerState, now: float) -> Pending:
        """The prompts queued on ``worker`` (not yet running)."""
        return self._views.of(worker, now).queued_now()

    def _room_for(self, worker: WorkerState, prefills: Pending) -> bool:
        """Seats in the batch, the token budget (a lone prefill may exceed it, as batch formation
        allows; chunks never do), and KV under the watermark for these prefills."""
        decodes = worker.batch_size + len(worker.incoming)
        if decodes + prefills.count > worker.rules.max_seqs:
            return False
        if (not self.toggle.chunked and prefills.count > 1
                and decodes + prefills.tokens > worker.rules.token_budget):
            return False
        return worker.kv.fits(prefills.kv_new, self.toggle.watermark)

    def decode_worker(self, req: Request, workers: Sequence[WorkerState],
                      now: float) -> WorkerState | None:
        """Fewest unfinished tokens among the workers whose planned next iteration also keeps the
        arriving request's own TPOT budget; any worker with room when none does. Under chunked
        multiplexing the request rather waits (None) while some worker decodes, so that no
        decode iteration outgrows a TPOT SLO it promised. A round of its own: each candidate's
        next iteration is read from its view (``WorkerViews``), which the round that the
        migrating worker's iteration end starts next carries where the worker has not moved."""
        self._views.new_round()
        chosen = first_fitting(by_load(workers, _MULTIPLEX, self._split(workers)[1]),
                               lambda w: has_room(req, w) and w.id not in self._roles.returning
                               and self._joins_in_time(req, w, now))
        if chosen is not None:
            return chosen
        if self.toggle.chunked and any(w.batch_size for w in workers if w.alive and decodes(w.role)):
            return None
        return decode_destination(req, workers)

    def rescue_floor(self, req: Request, now: float, workers: Sequence[WorkerState]) -> float:
        """Under chunked multiplexing, the soonest a multiplexing worker could finish ``req``'s
        prompt alone (``chunked_floors``): a later round may still move it there, the shortest
        prompts first, though none would take it at its arrival. (On synthetic at rate scale 0.5,
        early rejection refused 447 prompts, median 43 tokens, that a round moved and served in
        time when everything was admitted.) inf otherwise, or where there are no floors."""
        if not self.toggle.chunked:
            return math.inf
        open_to = [w for w in self._split(workers)[1] if w.id not in self._roles.returning]
        floor = chunked_floors(req, open_to, now) if open_to else None
        return math.inf if floor is None else min(floor(w) for w in open_to)

    def _joins_in_time(self, req: Request, worker: WorkerState, now: float) -> bool:
        """Would ``worker``'s decodes, ``req`` joining them, keep their TPOT (its queue's sums
        read from its view: under a burst a multiplexing worker queues dozens of prompts)?"""
        nxt = self._next_of(worker, now)
        if self.toggle.chunked:
            limit = min(nxt.min_tpot, req.slo.tpot)
            return self._decodes_fit(worker, nxt, self._queued_of(worker, now).plus(req, worker), limit)
        joined = nxt.with_joining(Decoding(req, req.generated, req.first_token_at))
        return joined.fits(worker.latency.iteration_time(joined.shape(list(nxt.queued))), self.toggle.slack)

    def _no_prefill_worker(self, req: Request, multiplex: list[WorkerState]) -> Assignment:
        target = fewest_unfinished(multiplex)
        if target is None:
            raise RuntimeError("no live worker takes new requests")
        return Assignment(req, target.id, PrefillPath.FALLBACK, "no live prefill worker")


def earliest_finish(req: Request, roster: Roster, now: float) -> tuple[WorkerState, float] | None:
    """The live prefill worker with the earliest predicted finish of ``req`` (lowest id breaks
    ties) and that finish, priced from the earliest floor up (``finish_floors``): over an
    indexed fleet whose prefill workers share one latency model, the floors of all of them are
    a few vector operations (``LoadIndex``), the prompt priced once per count of new tokens
    (``NewTokenFloors.vector``)."""
    prefill, workers = roster.prefill, roster.fleet
    index = fleet_index(workers)

    def cost(worker: WorkerState) -> float:
        return free_at(worker, now) + worker.prefill_estimate(req)

    if index is None or roster.latency is None:
        return cheapest(prefill, finish_floors(req, prefill, now), cost)
    ids = index.live_ids(_PREFILL)
    seconds = prompt_floor_vector(req, prefill, len(workers), roster.latency)
    bounds = index.free_at(ids, now) + seconds[ids]
    return cheapest_of(with_workers(ascending(bounds, ids), workers), cost)


def finish_floors(req: Request, prefill: list[WorkerState], now: float) -> Callable[[WorkerState], float]:
    """For each prefill worker, a floor on when it would finish ``req``'s prompt: when it is
    free, plus the prompt's floor there (``prompt_floors``)."""
    seconds = prompt_floors(req, prefill)
    return lambda worker: free_at(worker, now) + seconds(worker)


@dataclass(slots=True)
class Shortlists:
    """The multiplexing workers Path 2 prices for each prompt of one decision (see ``size``,
    ``SHORTLIST`` by default): the least loaded of those holding the deepest block of its prefix
    that any holds (where a follow-up turn finds its history; they would find about the same
    hit), and the least loaded. Loads stand through a decision, so the multiplexing workers are
    walked by load once per decision, as far as any shortlist reads, and each block's holders
    are ranked once: read off that walk if it meets enough of them within as many steps as there
    are holders (a burst of new conversations shares a first block that every worker holds) and
    within a shortlist's length, else by a heap over them. (What it keeps is made when first
    needed: a fleet no larger than a shortlist, as the paper cluster's, needs none, and builds
    one per decision: it writes its constructor, which mypyc compiles, see ``BatchShape``.)"""

    roster: Roster
    size: int = SHORTLIST
    _walk: Iterator[WorkerState] | None = None
    _ranked: list[WorkerState] | None = None
    _near: dict[int, tuple[set[int], list[WorkerState]]] | None = None

    def __init__(self, roster: Roster, size: int = SHORTLIST) -> None:
        self.roster = roster
        self.size = size
        self._walk = None
        self._ranked = None
        self._near = None

    def of(self, req: Request) -> list[WorkerState]:
        multiplex = self.roster.multiplex
        size = self.size
        if len(multiplex) <= size:
            return multiplex
        cache = multiplex[0].kv.cache
        directory = cache.directory if cache is not None else None
        near = self._nearest(directory.deepest_holders(req)) if directory is not None else []
        taken = {w.id for w in near}
        return near + [w for w in self._first(size) if w.id not in taken][:size - len(near)]

    def _first(self, count: int) -> list[WorkerState]:
        """The ``count`` least loaded multiplexing workers, least first (all, if fewer): one walk
        by load per decision, taken as far as asked."""
        if self._walk is None or self._ranked is None:
            self._walk = by_load(self.roster.fleet, _MULTIPLEX, self.roster.multiplex)
            self._ranked = []
        ranked = self._ranked
        while len(ranked) < count:
            worker = next(self._walk, None)
            if worker is None:
                break
            ranked.append(worker)
        return ranked

    def _nearest(self, holders: set[int]) -> list[WorkerState]:
        """``nearest`` among ``holders`` (the directory's own set of a block's holders, which no
        decision edits: kept by identity, with the set, so that its id is not reused)."""
        if not holders:
            return []
        if self._near is None:
            self._near = {}
        kept = self._near.get(id(holders))
        if kept is not None and kept[0] is holders:
            return kept[1]
        near = self._walked(holders)
        if near is None:
            near = nearest(holders & self.roster.multiplex_ids, self.roster.fleet, self.size // 2)
        self._near[id(holders)] = (holders, near)
        return near

    def _walked(self, holders: set[int]) -> list[WorkerState] | None:
        """``nearest`` among ``holders`` read off the walk by load, or None if the first
        ``len(holders)`` workers it reaches, or the first ``size`` (what the least loaded
        part of a shortlist reads anyway), hold fewer than half a shortlist of them (and it goes
        on): past that a heap over the holders ranks them the same, and under a burst at 1,024
        workers it costs less than the deeper walks, which made the index sort every other worker
        (``ascending``; docs/scaling.md)."""
        found: list[WorkerState] = []
        for place in range(min(len(holders), self.size)):
            ranked = self._first(place + 1)
            if place == len(ranked):
                return found
            if ranked[place].id in holders:
                found.append(ranked[place])
                if len(found) == self.size // 2:
                    return found
        return None


def nearest(holders: set[int], workers: Sequence[WorkerState], count: int) -> list[WorkerState]:
    """The ``count`` least loaded of ``holders`` (live multiplexing workers; fewer if fewer)."""
    return list(islice(least_loaded_first(workers[wid] for wid in holders), count))
