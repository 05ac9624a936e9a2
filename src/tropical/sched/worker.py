"""One worker's scheduling state: its queue, its decoding batch, its KV pool, its load.

Decode progress is kept lazily: a worker counts its decode iterations (``steps``) and a request
remembers the step it joined at, so advancing a whole batch by n iterations is O(1) plus one heap
pop per finishing request. The simulator advances runs of iterations in closed form; the engine
advances one at a time. Both call the same methods.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate, islice
from typing import Any, Final

from tropical.core.latency.fitted import FittedModel
from tropical.core.latency.iterations import prefill_time
from tropical.core.latency.model import LatencyModel
from tropical.core.latency.online import OnlineLatency
from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.sched.host_store import HostStore
from tropical.sched.kv import KVPool
from tropical.sched.lag import Lag
from tropical.sched.prefix_cache import PrefixCache
from tropical.sched.prefix_directory import PrefixDirectory
from tropical.sched.rules import BatchRules, Role, decodes
from tropical.sched.token_gaps import TokenGaps

CHUNK_SHARE_KEEP: Final = 1.0 - 1.0 / 128
"""How much of ``chunk_share`` one more decode iteration keeps: it forgets over about 128 of them,
fewer than a conversation's answer has tokens (343 on average), so it follows a change of load
within one answer."""


@dataclass(slots=True, eq=False)
class WorkerState:
    """What the policy sees of a worker and what batch formation consumes.

    ``waiting`` changes only through these methods, which count their edits (``queued_costs``
    keeps its prices until the next one, ``work_ahead`` their sums; ``waiting_tokens`` sums
    their unfinished tokens and ``waiting_prompt`` their prompt tokens still to compute; the last
    ``_yielded_tail`` of them yielded, and perhaps a few more before those). ``decode_context`` and
    ``decode_peak`` sum the running requests' contexts now and at their longest (``kv_tokens``).
    ``last_chunk`` is the chunk batch formation last cut here: where its next search starts
    (consecutive chunks of a prompt differ by a few tokens). ``host_load_s``: seconds to load one
    token's KV from the prefix cache's host-memory tier, if it has one (``add_host_tier``).
    ``chunk_share``: the share of its recent decode iterations that also carried prompt tokens,
    about the last ``1 / (1 - CHUNK_SHARE_KEEP)`` of them (the steady state that predictive
    admission expects a new request to decode beside).
    """

    id: int
    role: Role
    rules: BatchRules
    kv: KVPool
    latency: LatencyModel
    waiting: deque[Request] = field(default_factory=deque)
    inbox: list[Request] = field(default_factory=list)
    incoming: dict[int, Request] = field(default_factory=dict)
    running: dict[int, Request] = field(default_factory=dict)
    holds: dict[int, int] = field(default_factory=dict)
    decode_peak: int = 0
    waiting_tokens: int = 0
    waiting_prompt: int = 0
    batch_prefills: int = 0
    inflight: dict[int, int] = field(default_factory=dict)
    rests: dict[int, tuple[float, float]] = field(default_factory=dict)
    queued_work: float = 0.0
    alive: bool = True
    last_chunk: int = 0
    gaps: TokenGaps = field(default_factory=TokenGaps)
    lag: Lag | None = None
    index: object | None = None
    watchers: list[set[Any]] = field(default_factory=list)
    pace: float = 0.0
    edits: int = 0
    _steps: int = 0
    _decode_context: int = 0
    _running_remaining: int = 0
    _busy_until: float = 0.0
    _finishes: list[tuple[int, int, Request]] = field(default_factory=list)
    _costs: dict[Request, tuple[int, float]] = field(default_factory=dict)
    _queue_edits: int = 0
    _yielded_tail: int = 0
    _incoming_tokens: int = 0
    _min_tpot: tuple[int, float] = (-1, math.inf)
    _batch_edits: int = 0
    _priced_queue: tuple[int, int, tuple[tuple[Request, float], ...], int] = (-1, 0, (), 0)
    _queue_sums: tuple[tuple[tuple[Request, float], ...], list[float], list[float]] = ((), [], [0.0])
    host_load_s: float = 0.0
    chunk_share: float = 0.0
    _loads_taken: int = 0
    key: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """``key``: the id as an object, made once (compiled, an int id put in a set is boxed
        again each time, and ids past 256 are not shared: a thousand-worker fleet boxed 1.2
        million of them in ``changed`` over 8,000 requests)."""
        self.key = self.id

    def _lagging(self) -> Lag | None:
        """The substrate's ``Lag`` while this worker's decode run may have completed iterations
        not booked yet (a run is in flight, ``pace`` > 0, and its next iteration was due by
        now), else None. A worker whose iteration has just ended has no run in flight (its
        booking sets ``pace`` to 0): every read during its own booking and round asked the
        substrate for nothing, 376,000 times in a full-rate run of the paper cluster."""
        lag = self.lag
        if lag is None or self.pace <= 0.0:
            return None
        return lag if self._busy_until <= lag.now and self.running else None

    def changed(self) -> None:
        """Its load, role, liveness, KV or prefix cache may have moved: it marks itself in every
        set of ``watchers`` (the fleet's ``LoadIndex`` re-files it before its next walk, the
        toggle's ``QueueWatch`` looks at its queue again), and predictions kept for it lapse
        (``edits``)."""
        self.edits += 1
        for marks in self.watchers:
            marks.add(self.key)

    def tell(self, marks: set[Any]) -> None:
        """Mark this worker's id in ``marks`` whenever it changes (once, however often asked)."""
        if not any(kept is marks for kept in self.watchers):
            self.watchers.append(marks)

    def become(self, role: Role, rules: BatchRules) -> None:
        """Take another role, with its batch rules."""
        self.role, self.rules = role, rules
        self.changed()

    def _current(self) -> None:
        """Book the decode iterations completed by now, if the substrate books them lazily."""
        lag = self._lagging()
        if lag is not None:
            lag.catch_up(self.id)

    @property
    def steps(self) -> int:
        """Decode iterations this worker has run."""
        self._current()
        return self._steps

    @property
    def decode_context(self) -> int:
        """The running requests' contexts now."""
        self._current()
        return self._decode_context

    @property
    def running_remaining(self) -> int:
        """Output tokens the running requests have still to generate."""
        self._current()
        return self._running_remaining

    @property
    def busy_until(self) -> float:
        """When the iteration in flight ends (in the past: none is)."""
        self._current()
        return self._busy_until

    @busy_until.setter
    def busy_until(self, until: float) -> None:
        self._busy_until = until
        self.changed()

    @property
    def unfinished_tokens(self) -> int:
        """Prompt tokens still to prefill plus output tokens still to generate, all assigned work
        (the iterations run and not booked yet counted, not booked: see ``Lag``)."""
        remaining = self._running_remaining
        lag = self._lagging()
        if lag is not None:
            remaining -= len(self.running) * lag.unbooked(self.id)
        return self.waiting_tokens + remaining + self._incoming_tokens

    @property
    def load_floor(self) -> int:
        """``unfinished_tokens``, or less while a decode run is not booked up to now (see
        ``Lag``): the run counted as far as it can have gone, one iteration ending at
        ``busy_until`` and each next taking at least ``pace`` (one more for rounding), never
        past the next finish. A walk by load orders workers by it and reads the exact load of
        those it reaches."""
        remaining = self._running_remaining
        lag = self._lagging()
        if lag is not None:
            most = min(self._finishes[0][0] - self._steps, 2 + int((lag.now - self._busy_until) / self.pace))
            remaining -= len(self.running) * most
        return self.waiting_tokens + remaining + self._incoming_tokens

    def booked_load(self) -> tuple[int, int, int]:
        """The terms of ``load_floor`` that change only when this worker does: its load as
        booked, its batch while a substrate books its runs lazily (else 0) and the iterations
        to its next finish (what a ``LoadIndex`` keeps)."""
        load = self.waiting_tokens + self._running_remaining + self._incoming_tokens
        if not self._finishes:
            return load, 0, 0
        lazy = self.lag is not None and self.pace > 0.0
        return load, len(self.running) if lazy else 0, self._finishes[0][0] - self._steps

    def booked_busy_until(self) -> float:
        """``busy_until`` as booked (a ``LoadIndex`` reads it without booking anything)."""
        return self._busy_until

    @property
    def decode_context_floor(self) -> int:
        """``decode_context``, or less while a decode run is not booked up to now (contexts
        only grow within a run)."""
        return self._decode_context

    @property
    def incoming_tokens(self) -> int:
        """Output tokens still to generate by requests whose KV is on its way here (kept as
        ``incoming`` changes: every dispatch by load reads it for every worker)."""
        return self._incoming_tokens

    @property
    def batch_size(self) -> int:
        return len(self.running)

    def _batch_edited(self, req: Request, joined: bool) -> None:
        """Count a change of the running batch: ``req`` joined it or left it. The tightest TPOT
        SLO kept for the batch before stands through a join (with ``req``'s own) and through a
        leave by a request with a looser one: under load a decode batch changes at nearly every
        iteration, and a pass over it each time cost a fiftieth of a simulation."""
        edits, tightest = self._min_tpot
        self._batch_edits += 1
        if edits != self._batch_edits - 1:
            return
        if joined:
            self._min_tpot = (self._batch_edits, min(tightest, req.slo.tpot))
        elif req.slo.tpot > tightest:
            self._min_tpot = (self._batch_edits, tightest)

    def min_tpot(self) -> float:
        """The tightest TPOT SLO among the running requests (inf if none); kept until the batch
        changes, since every planned iteration of a decoding worker asks for it."""
        edits, tightest = self._min_tpot
        if edits != self._batch_edits:
            tightest = min((r.slo.tpot for r in self.running.values()), default=math.inf)
            self._min_tpot = (self._batch_edits, tightest)
        return tightest

    def generated(self, req: Request) -> int:
        """Output tokens ``req`` has so far; exact even in the middle of a lazy decode run."""
        return self.steps - req.step_base if req.id in self.running else req.generated

    def start_prefills(self, spans: list[tuple[Request, int]]) -> None:
        """The head requests of the queue enter the iteration now starting, each with its new
        prompt tokens (``inflight``: a chunk leaves the rest of its prompt queued)."""
        self.changed()
        self.batch_prefills = len(spans)
        self.inflight = {req.id: new for req, new in spans}
        self._queue_edits += 1
        for req, _ in spans:
            self._add_queued_work(req, -1)
        if len(self.waiting) == len(spans):
            self.queued_work = 0.0
        if self.rules.piece_tokens and self.role is Role.PREFILL:
            for req, new in spans:
                if new < req.remaining_prompt:
                    self._keep_rest(req, req.remaining_prompt - new)

    def _keep_rest(self, req: Request, left: int) -> None:
        """Count the last ``left`` tokens of a prompt cut into pieces, in flight now, in the
        queue's predicted work (it is queued again when the piece ends), with the queue key
        they will have then (``rests``: ``work_ahead`` counts them for prompts keyed after)."""
        cost = self.rest_cost(req, left)
        self.rests[req.id] = (self.key_of(req, cost), cost)
        self.queued_work += cost

    def rest_cost(self, req: Request, left: int) -> float:
        """Predicted time of the last ``left`` tokens of ``req``'s prompt here (the rest of a
        prompt cut into pieces: its KV loaded, the tokens before it computed)."""
        return prefill_time(self.latency, left, req.prompt_len - left)

    def in_flight(self) -> list[Request]:
        """The prompts of the iteration now running, in queue order."""
        return list(islice(self.waiting, self.batch_prefills))

    def _add_queued_work(self, req: Request, sign: int) -> None:
        """Keep ``queued_work``: the predicted prefill time of the queue, which Path 1 reads on
        prefill workers (elsewhere nobody reads it, and pricing every chunk would cost)."""
        if self.role is Role.PREFILL:
            self.queued_work += sign * self.prefill_cost(req)

    def _add_waiting(self, req: Request, sign: int) -> None:
        """Keep ``waiting_tokens`` (the unfinished tokens of the queue: its prompts still to
        compute and, where this worker decodes, the tokens still to generate) and
        ``waiting_prompt``."""
        to_generate = req.output_len - 1 if decodes(self.role) else 0
        self.waiting_tokens += sign * (req.remaining_prompt + to_generate)
        self.waiting_prompt += sign * req.remaining_prompt

    def queued(self, limit: int | None = None) -> list[Request]:
        """Waiting requests not in the iteration now running (those may still be moved)."""
        stop = None if limit is None else self.batch_prefills + limit
        return list(islice(self.waiting, self.batch_prefills, stop))

    def _queue_edited(self, slot: int) -> None:
        """Count an edit of ``waiting`` at ``slot``. One behind what ``queued_costs`` read to
        price its prompts (``behind`` places past the batch in flight) leaves those prices
        standing (under overload most arrivals join a queue far longer than the toggle looks,
        or behind prompts that yielded)."""
        edits, depth, costs, behind = self._priced_queue
        self._queue_edits += 1
        if edits == self._queue_edits - 1 and slot >= self.batch_prefills + behind:
            self._priced_queue = (self._queue_edits, depth, costs, behind)

    def queued_costs(self, limit: int) -> tuple[tuple[Request, float], ...]:
        """The first ``limit`` queued requests with their ``prefill_cost``, under laxity order
        only those ahead of the first that yielded: that one and every prompt behind it gave
        their TTFT SLO up for good (a prompt that yields goes behind all that may still meet
        theirs), so none of them can be at risk, and under overload they are most of a queue.
        The toggle scans them at every iteration end, so they are kept until the queue changes.
        (A loop: compiled, ``takewhile`` and a bound method call back in Python's own way.)"""
        edits, depth, costs, _ = self._priced_queue
        if edits != self._queue_edits or depth != limit:
            laxity, priced = self.rules.laxity, []
            for req in islice(self.waiting, self.batch_prefills, self.batch_prefills + limit):
                if laxity and req.yielded:
                    break
                priced.append((req, self.prefill_cost(req)))
            costs = tuple(priced)
            behind = limit if len(costs) == limit else len(costs) + 1
            self._priced_queue = (self._queue_edits, limit, costs, behind)
        return costs

    def work_ahead(self, key: float, limit: int) -> float:
        """Predicted prefill time of the queued prompts a new one whose queue key here is
        ``key`` would wait for: under laxity order those with a lower or equal key, found among
        the first ``limit`` as ``_laxity_slot`` finds its place (past them, the whole queue),
        and the rests of prompts cut into pieces now in flight with a lower or equal key; else
        the whole queue. Sums are kept with ``queued_costs``'s prices."""
        if not self.rules.laxity:
            return self.queued_work
        costs = self.queued_costs(limit)
        kept, keys, sums = self._queue_sums
        if kept is not costs:
            keys = [self.key_of(req, cost) for req, cost in costs]
            sums = list(accumulate((cost for _, cost in costs), initial=0.0))
            self._queue_sums = (costs, keys, sums)
        slot = len(keys)
        while slot > 0 and keys[slot - 1] > key:
            slot -= 1
        if slot == limit:
            return self.queued_work
        return sums[slot] + self.rests_ahead(key)

    def rests_ahead(self, key: float) -> float:
        """Predicted time of the rests of prompts cut into pieces now in flight whose queue key is
        at most ``key``: they are queued again before a prompt keyed ``key`` runs."""
        return sum(cost for rest_key, cost in self.rests.values() if rest_key <= key) if self.rests else 0.0

    def prefill_cost(self, req: Request) -> float:
        """Predicted time of ``req``'s remaining prompt here, cached until its progress changes
        (asked only of requests queued here). Kept by the request itself, not its id: compiled,
        an id is boxed anew (an allocation) at every lookup."""
        cached = self._costs.get(req)
        if cached is not None and cached[0] == req.computed:
            return cached[1]
        cost = prefill_time(self.latency, req.remaining_prompt, req.computed) + self.load_time(req)
        self._costs[req] = (req.computed, cost)
        return cost

    def add_host_tier(self, store: HostStore, seconds_per_token: float) -> None:
        """Put ``store`` (this worker's own, or one the cluster shares) under this worker's
        prefix cache, its loads taking ``seconds_per_token`` a token."""
        if self.kv.cache is None:
            raise ValueError("a host-memory KV tier extends the prefix cache: it needs --prefix-cache on")
        self.kv.cache.host = store
        self.host_load_s = seconds_per_token

    def load_time(self, req: Request) -> float:
        """Predicted time to load the part of ``req``'s cached run that is in host memory here
        (none once ``req`` references it: loaded)."""
        cache = self.kv.cache
        if cache is None or not cache.may_load or not req.prefix or req.id in cache.refs:
            return 0.0
        return cache.host_tokens(req) * self.host_load_s

    def loads_pending(self) -> int:
        """Tokens of KV loaded from host memory that no iteration here has waited for yet."""
        cache = self.kv.cache
        return 0 if cache is None else (cache.loaded_blocks - self._loads_taken) * self.kv.block_size

    def take_loads(self) -> int:
        """``loads_pending``, now for the next iteration here to wait for (a load is not assumed
        to overlap compute)."""
        tokens = self.loads_pending()
        if self.kv.cache is not None:
            self._loads_taken = self.kv.cache.loaded_blocks
        return tokens

    def hit(self, req: Request) -> int:
        """Prompt tokens of ``req`` that would start computed here: the cached run of its
        prefix blocks, at most all of its whole KV blocks but the one holding its last token
        (that token's logits must be computed, as in vLLM)."""
        cache = self.kv.cache
        if cache is None or not req.prefix:
            return 0
        return min(cache.lookup(req), self._hit_cap(req))

    def _hit_cap(self, req: Request) -> int:
        return (req.prompt_len - 1) // self.kv.block_size * self.kv.block_size

    def prompt_split(self, req: Request) -> tuple[int, int]:
        """``req``'s prompt tokens still to compute here and those already computed (or
        cached) here: its own progress if it is here, else what this worker's cache holds."""
        new, cached, _ = self.prompt_and_kv(req)
        return new, cached

    def prompt_and_kv(self, req: Request) -> tuple[int, int, int]:
        """``prompt_split`` and ``kv_to_reserve`` in one look at the cache (the toggle asks both
        of every candidate on every worker it tries)."""
        cache = self.kv.cache
        if cache is None or not req.prefix:
            return req.remaining_prompt, req.computed, self.kv_tokens_needed(req)
        if req.id in cache.refs:
            return req.remaining_prompt, req.computed, self.kv_tokens_needed(req) - cache.held_tokens(req)
        run = cache.lookup(req)
        if req.prefill_worker == self.id:
            return req.remaining_prompt, req.computed, self.kv_tokens_needed(req) - run
        hit = min(run, self._hit_cap(req))
        return req.prompt_len - hit, hit, self.kv_tokens_needed(req) - run

    def prefill_estimate(self, req: Request) -> float:
        """Predicted time of ``req``'s prompt here, its cached prefix not recomputed (priced
        afresh: asked of requests not queued here, which ``prefill_cost`` keeps prices for)."""
        new, cached = self.prompt_split(req)
        return prefill_time(self.latency, new, cached) + self.load_time(req)

    def kv_tokens_needed(self, req: Request) -> int:
        """A prefill-only worker holds the prompt; a decoding worker the whole lifetime's KV."""
        return req.kv_tokens if decodes(self.role) else req.prompt_len

    def kv_to_reserve(self, req: Request) -> int:
        """KV tokens ``req`` needs here beyond the cached blocks it references (or would)."""
        return self.prompt_and_kv(req)[2]

    def can_hold(self, req: Request, watermark: float = 1.0) -> bool:
        """Room for ``req`` here, counting the free cached blocks it would reference as used."""
        cache, revived = self.kv.cache, 0
        if cache is not None and req.prefix and req.id not in cache.refs:
            revived = cache.unreferenced_run(req)
        return self.kv.fits(self.kv_to_reserve(req), watermark, revived)

    def reserve(self, req: Request) -> bool:
        """Reserve ``req``'s KV here if it fits, referencing the run of its prompt cached here
        now (as vLLM looks it up when it schedules a request: a queued request holds nothing,
        so it never keeps the head of the queue from fitting); False leaves everything as it
        was. A prompt about to start takes the hit it finds now."""
        if req.id in self.holds:
            return True
        cache = self.kv.cache
        if cache is not None and cache.may_load and req.prefix and not self.can_hold(req):
            return False                     # before loading anything from host memory
        held = self.kv.pin(req) if req.prefix else 0
        tokens = self.kv_tokens_needed(req) - held
        if not self.kv.fits(tokens):
            self.kv.unpin(req)
            return False
        self.holds[req.id] = self.kv.reserve(tokens)
        self.changed()
        if req.first_token is None and req.prefix:
            self._rehit(req, min(held, self._hit_cap(req)))
        return True

    def _rehit(self, req: Request, hit: int) -> None:
        """A queued prompt starts with ``hit`` cached tokens instead of those it found when it
        queued (blocks cached or evicted since): its queue sums follow."""
        self.changed()
        if hit == req.cached:
            return
        self._add_queued_work(req, -1)
        more = req.cached - hit
        req.computed, req.cached = req.computed - more, hit
        self.waiting_tokens += more
        self.waiting_prompt += more
        self._queue_edits += 1
        self._add_queued_work(req, 1)

    def release(self, req: Request) -> None:
        self.kv.release(self.holds.pop(req.id, 0))
        self.kv.unpin(req)
        self.changed()

    def _store(self, req: Request, tokens: int) -> None:
        """``req``'s first ``tokens`` prompt tokens are computed here: the cache keeps them."""
        moved = self.kv.store(req, tokens)
        self.changed()
        if moved:
            self.holds[req.id] -= moved

    def enqueue(self, req: Request) -> None:
        """Accept a request whose prompt this worker will prefill (at the back, or by laxity);
        its prefix cached here starts computed."""
        self.changed()
        if self.kv.cache is not None and req.prefix:
            req.cached = req.computed = self.hit(req)
        self._put(self._laxity_slot(req) if self.rules.laxity else len(self.waiting), req)
        self._add_queued_work(req, 1)
        self._add_waiting(req, 1)

    def queue_key(self, req: Request) -> float:
        """Where ``req`` stands in this worker's queue under laxity order, least first:
        ``key_of`` its predicted prefill here (never, for one that yielded: laxity order keeps
        it behind every prompt that can still make it)."""
        if req.yielded:
            return math.inf
        return self.key_of(req, self.prefill_cost(req))

    def key_of(self, req: Request, cost: float) -> float:
        """The queue key of ``req`` costing ``cost`` here: its TTFT deadline plus the rules'
        ``size_weight`` times ``cost`` (-1: when its prefill must start to meet the SLO)."""
        return req.arrival + req.slo.ttft + self.rules.size_weight * cost

    def _laxity_slot(self, req: Request) -> int:
        """Where ``req`` goes among the queued prompts (never ahead of the batch in flight):
        after every prompt with a lower or equal ``queue_key``. New prompts mostly have the
        highest, so the scan from the back passes few but those that yielded (at the back: none),
        which it steps over unread. (Indexing a deque walks its blocks of 64 from the nearer
        end: near the back, where the scan stops, that is a few steps.)"""
        key, waiting, floor = self.queue_key(req), self.waiting, self.batch_prefills
        slot = len(waiting) if key == math.inf else max(floor, len(waiting) - self._yielded_tail)
        while slot > floor and self.queue_key(waiting[slot - 1]) > key:
            slot -= 1
        return slot

    def _put(self, slot: int, req: Request) -> None:
        """Insert ``req`` into ``waiting`` at ``slot``, keeping the queue's bookkeeping."""
        self._tail_inserted(slot, req)
        self.waiting.insert(slot, req)
        self._queue_edited(slot)

    def _take(self, slot: int) -> Request:
        """Remove and return the request at ``slot`` of ``waiting``, keeping the queue's
        bookkeeping (``batch_prefills`` and the predicted work are the caller's)."""
        req = self.waiting[slot]
        self._tail_removed(req, slot)
        self._queue_edited(slot)
        del self.waiting[slot]
        return req

    def _tail_inserted(self, slot: int, req: Request) -> None:
        """Keep ``_yielded_tail`` through ``req``'s insertion at ``slot`` (about to happen): a
        prompt with any slack goes ahead of every one that yielded, and the scan for its place
        steps over them unread (under overload a prefill queue holds hundreds)."""
        tail_from = len(self.waiting) - self._yielded_tail
        if slot < tail_from:
            return
        self._yielded_tail = self._yielded_tail + 1 if req.yielded else len(self.waiting) - slot

    def _tail_removed(self, req: Request, slot: int | None) -> None:
        """Keep ``_yielded_tail`` through ``req``'s removal from ``slot`` (None: not known, and
        one that yielded is counted out of the tail, where it may have been)."""
        if slot is None:
            if req.yielded:
                self._yielded_tail = max(0, self._yielded_tail - 1)
        elif slot >= len(self.waiting) - self._yielded_tail:
            self._yielded_tail -= 1

    @property
    def learns(self) -> bool:
        """Does its predictor learn online (so that ``learn`` is worth a batch shape)?"""
        return isinstance(self.latency, OnlineLatency)

    def learn(self, shape: BatchShape, seconds: float, times: int = 1) -> None:
        """An iteration over ``shape`` took ``seconds`` (``times`` alike ones did): a predictor
        that learns online takes it in (prompt costs priced earlier keep their price until the
        prompt progresses)."""
        if isinstance(self.latency, OnlineLatency):
            self.latency.observe(shape, seconds, times)

    def expect_migration(self, req: Request) -> int:
        """Reserve room for a request whose KV is on its way here; returns the prompt tokens
        of KV to move (those not cached here already)."""
        if not self.reserve(req):
            raise MemoryError(f"worker {self.id} has no room for request {req.id}")
        self.expect_landing(req)
        return req.prompt_len - self.kv.held_tokens(req)

    def expect_landing(self, req: Request) -> None:
        """Count ``req`` among the requests whose KV is on its way here (its room held)."""
        self.changed()
        self.incoming[req.id] = req
        self._incoming_tokens += req.output_len - req.generated

    def _landed(self, req: Request) -> None:
        """``req`` is no longer on its way here (it landed, or left)."""
        self.changed()
        if self.incoming.pop(req.id, None) is not None:
            self._incoming_tokens -= req.output_len - req.generated

    def join(self, req: Request) -> None:
        """Start decoding ``req`` here (after its prefill, or when its migrated KV arrives)."""
        self.changed()
        if req.id not in self.holds:
            raise RuntimeError(f"request {req.id} joins worker {self.id} without reserved KV")
        req.step_base = self.steps - req.generated
        req.decode_worker = self.id
        self.running[req.id] = req
        self._batch_edited(req, joined=True)
        self._decode_context += req.prompt_len + req.generated
        self.decode_peak += req.kv_tokens
        self._running_remaining += req.output_len - req.generated
        self.gaps.joined(req, self._steps)
        heapq.heappush(self._finishes, (req.step_base + req.output_len, req.id, req))

    def arrive_migrated(self, req: Request) -> None:
        """Migrated KV has landed (its prompt's blocks enter the cache); the request joins the
        batch at the next iteration boundary."""
        self._store(req, req.prompt_len)
        self.inbox.append(req)

    def admit_inbox(self) -> None:
        """Join every landed request; call only between iterations."""
        for req in self.inbox:
            self._landed(req)
            self.join(req)
        self.inbox.clear()

    def catch_up_deadline(self, now: float) -> float:
        """When the next iteration must end for every decode here that is behind its TPOT pace,
        or within one SLO of it, to be on pace (its tokens so far x TPOT SLO after its first
        token; inf if none is). A request whose KV migrated here is behind from the start; one
        whose iterations ran longer than predicted falls behind as they run: under predictor
        noise of 10% the iterations that fill a TPOT SLO by prediction ran over it by the
        error, and most of its misses were of TPOT. Both then get iterations short enough to
        catch up. (Under exact predictions an iteration that keeps its SLO keeps every decode
        on pace.) Asked once per iteration that carries multiplexed prompts; it books the decode
        run once (``steps``) and reads each running request's tokens from it, as ``generated``
        does, since asking ``generated`` per request was 14% of a full-rate run."""
        deadline, steps = math.inf, self.steps
        for req in self.running.values():
            due = req.on_pace_until(steps - req.step_base)
            if due - now < req.slo.tpot and due < deadline:
                deadline = due
        return deadline

    def steps_to_next_finish(self) -> int:
        """Decode iterations until the earliest running request finishes (0 if none runs)."""
        return self._finishes[0][0] - self.steps if self._finishes else 0

    def advance_decodes(self, n: int, now: float, first: float = 0.0,
                        growth: float = 0.0) -> list[Request]:
        """Account for n decode iterations of the whole running batch ending at ``now``.

        A run of n > 1 also says how long its iterations took (``first``, growing by
        ``growth`` each), so that every request's gaps between tokens are booked exactly.
        """
        self.changed()
        batch = len(self.running)
        assert n >= 1 and batch, "advancing an empty decode batch"
        assert n <= self._finishes[0][0] - self._steps, "a decode run must not skip past a finish"
        self.gaps.booked(self._steps, n, batch, now, first, growth)
        keep = CHUNK_SHARE_KEEP if n == 1 else CHUNK_SHARE_KEEP ** n
        self.chunk_share = self.chunk_share * keep + (1.0 - keep) * (self.batch_prefills > 0)
        self._steps += n
        self._decode_context += n * batch
        self._running_remaining -= n * batch
        finished = []
        while self._finishes and self._finishes[0][0] <= self._steps:
            _, _, req = heapq.heappop(self._finishes)
            del self.running[req.id]
            self._batch_edited(req, joined=False)
            self._decode_context -= req.prompt_len + req.output_len
            self.decode_peak -= req.kv_tokens
            req.generated = req.output_len
            req.finish = now
            self.gaps.finished(req)
            self.release(req)
            finished.append(req)
        if finished:
            self.gaps.prune(self.running.values())
        return finished

    def complete_prefill(self, req: Request, new: int, now: float) -> bool:
        """Record ``new`` prompt tokens computed; True when the whole prompt is done.

        A finished prompt yields the first token now. On a decoding worker the request then
        decodes in place; on a prefill worker it waits for migration (the caller's job).
        """
        self.changed()
        req.computed += new
        self._store(req, req.computed)
        in_flight = self.inflight.pop(req.id, None) is not None
        self.waiting_tokens -= new
        self.waiting_prompt -= new
        self.batch_prefills = max(0, self.batch_prefills - 1)
        if req.computed < req.prompt_len:
            self._queue_edits += 1                     # the rest of it is queued again
            if self.rests.pop(req.id, None) is None:
                self._add_queued_work(req, 1)
            if self.rules.piece_tokens and self.rules.laxity:
                self._requeue(req)
            return False
        self._tail_removed(req, None)
        self.waiting.remove(req)
        self._queue_edits += not in_flight          # from the batch in flight: the queued stay as they were
        self._costs.pop(req, None)
        req.first_token = now
        req.generated = 1
        if decodes(self.role):
            self.waiting_tokens -= req.output_len - 1
            if req.output_len == 1:
                req.finish = now
                self.release(req)
            else:
                self.join(req)
        elif req.output_len == 1:
            req.finish = now
            self.release(req)
        return True

    def _requeue(self, req: Request) -> None:
        """Queue the rest of ``req``, a prompt cut into pieces whose piece ended, by its queue
        key, so that more urgent prompts queued meanwhile run first: preemption at piece
        boundaries. Its KV stays reserved: unless the prompts it would go behind fit beside it
        (their whole prompts, none of them cached), it keeps the head of the queue, behind the
        batch in flight (see ``held_first``)."""
        self.changed()
        self._take(self.waiting.index(req))
        slot = self._laxity_slot(req)
        self._put(slot if self._fit_beside(slot) else self.batch_prefills, req)

    def _fit_beside(self, slot: int) -> bool:
        """Do the whole prompts queued from the batch in flight to ``slot`` (none of them cached,
        those holding KV already left out) fit in the free KV? (Summed only until they do not:
        past the trace's full rate a queue holds hundreds.)"""
        room, ahead = self.kv.room_tokens(), 0
        for r in islice(self.waiting, self.batch_prefills, slot):
            if r.id not in self.holds:
                ahead += self.kv_tokens_needed(r)
                if ahead > room:
                    return False
        return True

    def held_first(self) -> None:
        """If the head of the queue cannot reserve its KV, move the first queued prompt that holds
        its KV already (the rest of one cut into pieces) to the head: a prompt behind it holds
        memory that only its own end frees, and a rest needs no more, so the queue never waits
        on memory that cannot come."""
        if not self.waiting or self.batch_prefills or self.reserve(self.waiting[0]):
            return
        held = next((slot for slot, r in enumerate(self.waiting) if r.id in self.holds), None)
        if held is None:
            return
        self.changed()
        self._put(0, self._take(held))

    def abort(self, req: Request) -> None:
        """Drop ``req`` from this worker wherever it is (queued, decoding, or migrating in, landed
        or not), freeing its KV."""
        self.changed()
        self._landed(req)
        if req in self.inbox:
            self.inbox.remove(req)
        if req in self.waiting:
            slot = self.waiting.index(req)
            self._take(slot)
            if slot >= self.batch_prefills:
                self._add_queued_work(req, -1)
            else:
                self.batch_prefills -= 1
                self.inflight.pop(req.id, None)
                self.queued_work -= self.rests.pop(req.id, (0.0, 0.0))[1]
            self._costs.pop(req, None)
            self._add_waiting(req, -1)
        if req.id in self.running:
            req.generated = self.generated(req)
            del self.running[req.id]
            self._batch_edited(req, joined=False)
            self._decode_context -= req.prompt_len + req.generated
            self.decode_peak -= req.kv_tokens
            self._running_remaining -= req.output_len - req.generated
            self._finishes = [f for f in self._finishes if f[2] is not req]
            heapq.heapify(self._finishes)
            self.gaps.left(req)
        self.release(req)
        if req.first_token is None:
            if req.computed > req.cached:
                req.own = (req.cached, req.computed)
            req.computed -= req.cached           # its cached prefix was this worker's
            req.cached = 0


# A real engine measures time instead of predicting it; a WorkerState only prices work for the TPOT
# guard and for prefill-only workers, so a colocated engine without a profile runs unpriced.
UNPRICED = FittedModel(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, transfer_bandwidth=1.0)


def worker_state(worker_id: int, role: Role, rules: BatchRules, cache_blocks: int, block_size: int,
                 latency: LatencyModel = UNPRICED, prefix_cache: bool = False,
                 directory: PrefixDirectory | None = None) -> WorkerState:
    """A WorkerState whose KV pool mirrors an engine cache of ``cache_blocks`` blocks (with a
    prefix cache, whose keys the fleet's ``directory`` tracks if given)."""
    cache = PrefixCache(block_size, directory, worker_id) if prefix_cache else None
    return WorkerState(worker_id, role, rules, KVPool(cache_blocks, block_size, cache=cache), latency)
