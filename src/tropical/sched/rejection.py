"""Early rejection: refuse, before any work, the requests the cluster is predicted to serve late.

Past capacity a policy that admits everything serves almost nobody on time: every request waits
behind others that will miss too. One admission stage serves every policy, asked by the Cluster:

``none``         admit everything (the published figures).
``early-reject`` refuse an arriving request when its predicted TTFT on the path the policy chose
                 misses its TTFT SLO, and so does the soonest a later decision of the policy could
                 give it (a toggle moves queued prompts to multiplexing workers in later rounds);
                 and refuse a queued request, while nothing has been computed for it, once its
                 TTFT can no longer be met behind the prompts ahead of it.
``predictive``   also refuse when the decode load predicted for the moment its prefill would end
                 breaks its TPOT SLO on average or its TBT SLO in one iteration (Mooncake's
                 prediction-based early rejection: the load *then*, not now, so that prefill and
                 decode admissions do not oscillate).

Predictions reuse each worker's latency model: a prompt's prefill time (``prefill_estimate``,
``prefill_cost``), when a worker is free (``busy_until``) and a decode iteration's time. A
rejected request never reaches a worker's queue, or leaves it before it holds KV or ran a token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from tropical.core.latency.iterations import decode_time
from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.sched.assignment import Assignment
from tropical.sched.rules import Role, decodes, takes_arrivals
from tropical.sched.worker import WorkerState


class AdmissionMode(str, Enum):
    NONE = "none"
    EARLY_REJECT = "early-reject"
    PREDICTIVE = "predictive"


TTFT = "ttft"
"""At arrival: the TTFT predicted on the policy's path misses the SLO."""
TTFT_QUEUED = "ttft_queued"
"""While queued, nothing computed yet: its TTFT can no longer be met behind the prompts ahead."""
DECODE_LOAD = "decode_load"
"""At arrival (predictive): the decode load when its prefill ends would break its TPOT SLO."""
REASONS = (TTFT, TTFT_QUEUED, DECODE_LOAD)
Later = Callable[[Request, float, Sequence[WorkerState]], float]
"""A policy's floor on the first token a later decision of its own could give a request queued
now (``Policy.rescue_floor``)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused (``reason``, one of ``REASONS``; ``message`` for people) and
    when the predicted backlog that refused it will have cleared (``retry_after`` seconds)."""

    reason: str
    message: str
    retry_after: float


@dataclass(frozen=True, slots=True)
class Admission:
    """The admission stage of one run; stateless, so one object serves any number of runs."""

    mode: AdmissionMode = AdmissionMode.NONE

    @property
    def active(self) -> bool:
        return self.mode is not AdmissionMode.NONE

    def at_arrival(self, req: Request, placed: Assignment, now: float,
                   workers: Sequence[WorkerState], later: Later | None = None) -> Refusal | None:
        """Refuse ``req``, which the policy placed as ``placed`` says, or None to admit it: when
        neither the policy's prediction for that path, nor that of any worker taking arrivals,
        nor the soonest a later decision of the policy could give (``later``, asked only then;
        see ``Policy.rescue_floor``) gives its first token in time."""
        if not self.active:
            return None
        worker = workers[placed.worker_id]
        paths = [w for w in workers if w.alive and takes_arrivals(w.role)]
        first_token, _, best = min((predicted_first_token(req, w, now), w.id, w) for w in paths)
        chosen = placed.first_token if placed.first_token is not None else math.inf
        if (min(first_token, chosen) - req.arrival > req.slo.ttft
                and (later is None or later(req, now, workers) - req.arrival > req.slo.ttft)):
            backlog = first_token - best.prefill_estimate(req) - now
            return Refusal(TTFT, f"predicted TTFT {first_token - req.arrival:.4g}s on worker {best.id} "
                                 f"exceeds the TTFT SLO {req.slo.ttft:.4g}s", backlog)
        if self.mode is AdmissionMode.PREDICTIVE:
            ends = min(chosen, predicted_first_token(req, worker, now))
            return decode_refusal(req, worker, ends, now, workers)
        return None

    def lapsed(self, worker: WorkerState, now: float) -> list[tuple[Request, Refusal]]:
        """The queued prompts of ``worker`` to refuse now: those with nothing computed yet whose
        TTFT can no longer be met behind the prompts ahead of them that stay (in queue order).
        Ask between the worker's iterations."""
        if not self.active:
            return []
        clock, out = max(now, worker.busy_until), []
        for req in worker.queued():
            cost = worker.prefill_cost(req)
            late = clock + cost - req.arrival
            if late > req.slo.ttft and untouched(req, worker):
                out.append((req, Refusal(TTFT_QUEUED, f"TTFT SLO {req.slo.ttft:.3f}s can no longer be met "
                                                      f"(predicted {late:.3f}s) on worker {worker.id}",
                                         clock - now)))
            else:
                clock += cost
        return out


def predicted_first_token(req: Request, worker: WorkerState, now: float) -> float:
    """When ``req``'s first token would come on ``worker``: once the worker is free, the
    prompts ahead of it and its own."""
    cost = worker.prefill_estimate(req)
    return max(now, worker.busy_until) + work_ahead(worker, req, cost) + prefill_tax(worker, req) + cost


def untouched(req: Request, worker: WorkerState) -> bool:
    """Nothing computed for ``req`` yet (a cached prefix aside) and no KV held for it."""
    return req.computed == req.cached and req.id not in worker.holds and req.id not in worker.inflight


def work_ahead(worker: WorkerState, req: Request, cost: float) -> float:
    """Predicted prefill time of the prompts queued on ``worker`` that would run before ``req``
    (costing ``cost`` there): all of them in arrival order, those with a lower or equal queue
    key in laxity order (``WorkerState.queue_key``), with the rests of prompts cut into pieces
    now in flight that are keyed so too."""
    if worker.role is Role.PREFILL and not worker.rules.laxity:
        return worker.queued_work
    queued = worker.queued()
    if worker.rules.laxity:
        key = worker.key_of(req, cost)
        return (sum(worker.prefill_cost(q) for q in queued if worker.queue_key(q) <= key)
                + worker.rests_ahead(key))
    return sum(worker.prefill_cost(q) for q in queued)


def prefill_tax(worker: WorkerState, req: Request) -> float:
    """Decode time that a chunked worker's prompt iterations carry until ``req``'s prompt is
    through: one decode of its batch per token budget of prompt (decodes first, then chunks)."""
    if not worker.rules.chunked or not worker.running:
        return 0.0
    room = max(1, worker.rules.token_budget - worker.batch_size)
    iterations = math.ceil((worker.waiting_prompt + req.remaining_prompt) / room)
    return iterations * decode_time(worker.latency, worker.batch_size, worker.decode_context)


def decode_refusal(req: Request, worker: WorkerState, first_token: float, now: float,
                   workers: Sequence[WorkerState]) -> Refusal | None:
    """Refuse ``req`` if no worker it may decode on (``worker`` itself when that decodes) is
    predicted to run decode iterations within its TPOT SLO, and those of the requests decoding
    there, on average, and each within its TBT SLO, once its prefill ends at ``first_token``."""
    if decodes(worker.role):
        targets, joining = [worker], Joining()
    else:
        targets = [w for w in workers if w.alive and decodes(w.role)]
        joining = Joining.of([w for w in workers if w.alive and not decodes(w.role)], len(targets))
    overs = []
    for w in targets:
        load = decode_load(w, req, joining, decode_steps(w, first_token, now) if w is not worker else 0)
        tpot = min(req.slo.tpot, w.min_tpot())
        overs.append((max(load.mean - tpot, load.peak - req.slo.tbt), w.id, load, tpot))
    if not overs:
        return None
    over, target, load, tpot = min(overs)
    if over <= 0:
        return None
    said = (f"mean decode iteration {load.mean:.4g}s on worker {target} when its prefill ends exceeds "
            f"the TPOT SLO {tpot:.4g}s" if load.mean > tpot else
            f"decode iteration {load.peak:.4g}s on worker {target} when its prefill ends exceeds "
            f"the TBT SLO {req.slo.tbt:.4g}s")
    return Refusal(DECODE_LOAD, f"predicted {said}",
                   max(first_token - now, 0.0) + next_finish(workers[target], now))


@dataclass(frozen=True, slots=True)
class DecodeLoad:
    """A worker's decode iterations predicted once a request joins: their ``mean`` over its
    decode, and the longest (``peak``, one that carries a chunk of prompt)."""

    mean: float
    peak: float


@dataclass(frozen=True, slots=True)
class Joining:
    """The prompts queued on prefill-only workers, a decoding worker's share of them: they
    finish before a prompt that arrives now and then decode somewhere (``count`` of them, with
    ``context`` tokens of KV at their longest)."""

    count: int = 0
    context: int = 0

    @classmethod
    def of(cls, prefill: Sequence[WorkerState], decoders: int) -> Joining:
        queued = [r for w in prefill for r in w.waiting]
        share = max(decoders, 1)
        return cls(math.ceil(len(queued) / share), math.ceil(sum(r.kv_tokens for r in queued) / share))


def decode_steps(worker: WorkerState, at: float, now: float) -> int:
    """Decode iterations ``worker`` runs from now until ``at``, each as long as one now."""
    if not worker.running:
        return 0
    return int(max(0.0, at - max(now, worker.busy_until)) / current_iteration(worker))


def decode_load(worker: WorkerState, req: Request, joining: Joining, steps: int) -> DecodeLoad:
    """Predicted time of ``worker``'s decode iterations once ``req`` joins, ``steps`` decode
    iterations from now: the running requests that will not have finished by then, those on
    their way, the prompts queued there, those ``joining`` from prefill workers, and ``req``,
    each at its longest context (it grows while they decode). On a chunked worker (unless its
    TPOT slack sizes its chunks, keeping its decodes' pace) an iteration may carry a chunk that
    fills its token budget, over the context ``mean_cached`` of the prompts queued there, in the
    share ``chunk_share`` of them: their ``mean`` is what a TPOT SLO bounds, and a TBT SLO
    bounds each, the chunked one too. A worker that prefills ``req`` itself runs no decode steps
    before (``steps`` 0): its prompts come first, or share their iterations."""
    queued = [*worker.incoming.values(), *worker.waiting]
    count = 1 + len(queued) + joining.count
    context = req.kv_tokens + sum(r.kv_tokens for r in queued) + joining.context
    for r in worker.running.values():
        if worker.generated(r) + steps < r.output_len:
            count, context = count + 1, context + r.kv_tokens
    shape = BatchShape.decode(count, context)
    base = worker.latency.iteration_time(shape)
    rules = worker.rules
    chunk = rules.token_budget - count if rules.chunked and rules.tpot_guard is None else 0
    if chunk <= 0:
        return DecodeLoad(base, base)
    full = worker.latency.iteration_time(shape.plus_prefill(chunk, mean_cached(worker.waiting, req)))
    return DecodeLoad(base + chunk_share(worker, req, chunk) * (full - base), full)


def chunk_share(worker: WorkerState, req: Request, chunk: int) -> float:
    """The share of ``req``'s decode iterations on chunked ``worker`` predicted to carry a chunk
    of ``chunk`` prompt tokens: the worker's recent share (``chunk_share``: the prompts that
    arrive while it decodes are chunked beside it as those before were) and the chunks the
    prompts queued there now need, spread over its decode steps (a backlog now says the
    arrivals outpace the chunks; counting it also keeps this share up while a burst begins).
    A self-scheduled worker's mirror books no chunks (``sched.mirror``): there the backlog
    alone counts."""
    backlog = math.ceil(worker.waiting_prompt / chunk) / max(1, req.output_len)
    return min(1.0, worker.chunk_share + backlog)


def mean_cached(prompts: Iterable[Request], req: Request) -> int:
    """The context a chunk of these prompts and ``req`` has cached before it, on average over
    their tokens (a chunk at a prompt's token t follows t of them: half a prompt, by tokens)."""
    lengths = [r.prompt_len for r in prompts] + [req.prompt_len]
    return sum(n * n for n in lengths) // (2 * sum(lengths))


def current_iteration(worker: WorkerState) -> float:
    """A decode iteration of ``worker``'s running batch as it stands (some running)."""
    return max(decode_time(worker.latency, worker.batch_size, worker.decode_context), 1e-9)


def next_finish(worker: WorkerState, now: float) -> float:
    """Seconds until ``worker``'s next running request finishes, at today's iteration time."""
    if not worker.running:
        return 0.0
    return max(0.0, worker.busy_until - now) + worker.steps_to_next_finish() * current_iteration(worker)


def arrival_refusal(admission: Admission, req: Request, assignments: Sequence[Assignment], now: float,
                    workers: Sequence[WorkerState], later: Later | None = None) -> Refusal | None:
    """``admission``'s answer for ``req``, placed by the policy as ``assignments`` say (``later``:
    the policy's floor on a later decision's first token, as ``Admission.at_arrival`` asks)."""
    if not admission.active:
        return None
    placed = next((a for a in assignments if a.request is req), None)
    if placed is None:
        return None
    return admission.at_arrival(req, placed, now, workers, later)
