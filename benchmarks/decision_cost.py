"""Wall time of one toggle decision with many requests queued, per policy.

Usage: python benchmarks/decision_cost.py [--queued 1000] [--decisions 2000] [--workers 4]
                                          [--decoding 32] [--json]
Builds the paper cluster (by default 2 prefill + 2 multiplexing workers of InternLM2-20B; more
with ``--workers``), queues ``--queued`` conversation-trace requests on the prefill workers, puts
a decoding batch of ``--decoding`` on each multiplexing worker (as the trace's requests last),
then times ``on_arrival`` and ``on_iteration_end`` calls (the two moments
the toggle decides) and reports their P50/P99 in microseconds, side by side in one process.
Repeated iteration ends see an unchanged queue, whose at-risk prompts the toggle keeps; the
last columns time iteration ends that each follow a change at the head of a prefill queue (its
first queued request leaves, another joins at the back), so that queue is priced and scanned
again, as after every prefill iteration.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from tropical import native
from tropical.config import SimConfig
from tropical.core.request import Request
from tropical.report.tables import render
from tropical.sched.registry import make_policy
from tropical.sched.rules import Role
from tropical.sched.worker import WorkerState
from tropical.sim.build import experiment
from tropical.sim.run import Experiment, make_requests


def loaded_cluster(exp: Experiment, queued: int,
                   decoding: int) -> tuple[object, list[WorkerState], list[Request]]:
    """The policy and its workers with ``queued`` prompts waiting and up to ``decoding``
    requests decoding on each multiplexing worker (those whose KV fits, while the trace lasts)."""
    policy = make_policy(exp.policy, exp.params)
    workers = exp.cluster.build(policy)
    requests = make_requests(exp)
    prefill = [w for w in workers if w.role is Role.PREFILL]
    decoders = [w for w in workers if w.role is Role.MULTIPLEX]
    for i, req in enumerate(requests[:queued]):
        prefill[i % len(prefill)].enqueue(req)
    rest = iter(requests[queued:])
    for worker in decoders:
        while worker.batch_size < decoding:
            req = next(rest, None)
            if req is None:
                break
            if worker.can_hold(req):
                worker.enqueue(req)
                worker.reserve(req)
                worker.complete_prefill(req, req.prompt_len, 0.0)
    return policy, workers, list(rest)


def head_moves(worker: WorkerState, joining: Request) -> None:
    """``worker``'s first queued request leaves and ``joining`` queues at the back."""
    worker.abort(worker.queued(1)[0])
    worker.enqueue(joining)


def timed(call: Callable[[], object], count: int,
          before: Callable[[int], object] = lambda i: None) -> np.ndarray:
    """Microseconds of ``count`` calls, each after ``before(i)`` (not timed)."""
    samples = np.empty(count)
    for i in range(count):
        before(i)
        started = time.perf_counter()
        call()
        samples[i] = time.perf_counter() - started
    return samples * 1e6


def measure(exp: Experiment, queued: int, decisions: int, decoding: int) -> dict[str, float]:
    policy, workers, fresh = loaded_cluster(exp, queued, decoding)
    arrivals = iter(fresh)
    now = max(r.arrival for r in fresh[:1]) if fresh else 0.0
    count = min(decisions, len(fresh) // 2)
    arrive = timed(lambda: policy.on_arrival(next(arrivals), now, workers), count)
    ends = timed(lambda: policy.on_iteration_end(workers[-1], now, workers), decisions)
    prefill = [w for w in workers if w.role is Role.PREFILL]
    changed = timed(lambda: policy.on_iteration_end(workers[-1], now, workers), count,
                    before=lambda i: head_moves(prefill[i % len(prefill)], fresh[count + i]))
    return {f"{name}_p{q}_us": float(np.percentile(samples, q))
            for name, samples in (("arrival", arrive), ("iteration_end", ends),
                                  ("iteration_end_after_head_moves", changed))
            for q in (50, 99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=1000)
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--policies", default="tropical,tropical+")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--decoding", type=int, default=32, help="requests decoding per multiplexing worker")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = experiment(replace(SimConfig().with_preset(), workers=args.workers))
    out = {p: measure(base.with_policy(p), args.queued, args.decisions, args.decoding)
           for p in args.policies.split(",")}
    if args.json:
        print(json.dumps({"queued": args.queued, "workers": args.workers, "decision_us": out,
                          "compiled": native.running()}))
        return
    rows = [[p, *(f"{v:.0f}" for v in m.values())] for p, m in out.items()]
    how = "compiled (tropical native)" if native.running() else "plain Python"
    print(f"decision cost at {args.workers} workers with {args.queued} queued requests "
          f"(µs, {args.decisions} decisions each), {how}")
    print(render(["policy", "arrival P50", "arrival P99", "iteration end P50", "iteration end P99",
                  "after the head moves P50",
                  "after the head moves P99"], rows))


if __name__ == "__main__":
    main()
