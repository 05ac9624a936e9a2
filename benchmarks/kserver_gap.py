"""Where `tropical+` loses against the k-server bound: capacities beside both burst bounds, then one
run at the k-server bound's rate taken apart in the report's "why requests miss" style.

For each trace (the paper cluster, the preset SLOs):

- the work bound, the pooled bound and the k-server bound (``sim.pooled_bound``), and each policy's
  capacity (``tropical sweep``'s search), as a share of the k-server and the pooled bound;
- each policy against the work and k-server bounds priced at its own reuse: every prompt less the
  hit it had in the policy's run at its capacity (the bounds above assume one unbounded
  cluster-wide cache), so that the share of the gap that is reuse is told from the scheduling;
- the same bounds priced at the reuse of one cluster-wide cache the size of the cluster's KV
  (HBM), evicting furthest next use first (clairvoyant) or least recently used first (as the
  engines evict), and each policy's share of their k-server bounds: what a target priced at the
  unbounded cache asks beyond the cluster's memory;
- the capacity of each variant of the k-server ideal (its servers never preempting, each prompt
  bound at its arrival to one server, both), and each policy's share of it;
- at the k-server bound's rate (where the ideal of k servers meets >= 90% of TTFT SLOs) and at
  ``--past`` times `tropical+`'s own capacity (just past it): the ideals' TTFT attainment and
  `tropical+`'s attainment, then its misses
  - by cause (``core.metrics.miss_cause``),
  - by when: each arrival's window of ``--window`` seconds, binned by the window's prompt load
    (prefill work arriving in it over what k servers do in it, decodes paid), so misses in
    bursts (load > 1) are told from misses in calm,
  - by where: the path and the worker that prefilled each missed request, beside that worker's
    share of all prompts,
  - by what: the prompt's length, in quartiles of the trace (a TTFT SLO scales with the prompt's
    own prefill, so a short prompt queued behind long ones misses first; the ideals serve the
    earliest deadline first, preempting),
  - over the run: the miss rate in each tenth of the arrivals, each worker's busy share of the
    run (its last finish), the share it spent in iterations that prefill and how many prompt
    tokens it computed per second in them (a multiplexing worker's chunks, sized to a TPOT SLO,
    prefill slower than a prefill worker's batches), and the prefix hit rate beside the ideal
    cache's that the bounds assume;
  - against part of the ideal: the TTFT attainment of 1, 2, ... k ideal servers at one worker's
    speed each, of k servers that preempt a prompt only after ``--quantum`` seconds (one
    iteration of a serving engine), of k that never preempt, of k with each prompt bound at its
    arrival to the server with the least work left (as a router binds it to a worker's queue),
    preempting or not, of k with each prompt bound where it starts soonest, never preempted,
    also with each server at its worker's measured prefill speed (what the multiplexing
    workers' slower chunks alone cost the ideal), and how many ideal servers `tropical+`'s TTFT
    attainment is worth (interpolated between whole servers): the share of the fleet it serves
    prompts with, as the ideal would.

    .venv/bin/python benchmarks/kserver_gap.py --traces synthetic,azure-code [--json]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from collections.abc import Sequence

from tropical.config import SimConfig
from tropical.core.metrics import miss_cause, ttft
from tropical.core.request import Request
from tropical.report.markdown import CAUSES
from tropical.report.tables import render
from tropical.sim.build import experiment
from tropical.sim.pooled_bound import PooledCluster, cache_hits, hit_share
from tropical.sim.reproduce import IDEAL_CACHES
from tropical.sim.run import Experiment, simulate
from tropical.sim.simulator import WorkerStats
from tropical.sim.sweep import capacities

LOAD_BINS = ((0.0, 0.5), (0.5, 1.0), (1.0, 2.0), (2.0, float("inf")))


def window_loads(pooled: PooledCluster, rate: float, window: float) -> dict[int, float]:
    """Each window's prompt work arriving at ``rate`` over what the k servers do in it."""
    work: Counter[int] = Counter()
    for arrival, prefill, _ in pooled.jobs(rate):
        work[int(arrival // window)] += prefill
    speed = pooled.prefill_speed(rate) * window
    return {w: v / speed for w, v in work.items()}


def by_load(requests: Sequence[Request], loads: dict[int, float], window: float) -> list[dict]:
    """Arrivals and misses in windows of each load bin."""
    rows = []
    missed = [r for r in requests if miss_cause(r) is not None]
    def load(r: Request) -> float:
        return loads.get(int(r.arrival // window), 0.0)

    for lo, hi in LOAD_BINS:
        arrivals = sum(lo <= load(r) < hi for r in requests)
        misses = sum(lo <= load(r) < hi for r in missed)
        rows.append({"load": f"{lo:g}-{hi:g}", "arrivals": arrivals / len(requests),
                     "misses": misses / max(1, len(missed)),
                     "missed_there": misses / max(1, arrivals)})
    return rows


def by_worker(requests: Sequence[Request]) -> list[dict]:
    """Per prefilling worker and path: its share of prompts and of misses, and its miss rate."""
    missed = [r for r in requests if miss_cause(r) is not None]
    keys = Counter((r.prefill_worker, r.path.value) for r in requests)
    misses = Counter((r.prefill_worker, r.path.value) for r in missed)
    return [{"worker": w, "path": p, "prompts": n / len(requests),
             "misses": misses[(w, p)] / max(1, len(missed)), "missed_there": misses[(w, p)] / n}
            for (w, p), n in sorted(keys.items(), key=str)]


def worth_servers(attained: float, ideal: Sequence[float]) -> float:
    """How many ideal servers ``attained`` is worth, given ``ideal[j - 1]``, the attainment of j
    of them: interpolated between the two whole counts around it (from none, which attain
    nothing, below one; ``len(ideal)`` at or above what all of them attain)."""
    below, fewer = 0.0, 0
    for count, share in enumerate(ideal, 1):
        if attained <= share:
            return fewer + (attained - below) / (share - below) if share > below else float(count)
        below, fewer = share, count
    return float(len(ideal))


def decompose(pooled: PooledCluster, rate: float, window: float, quantum: float) -> dict:
    """`tropical+` at ``rate`` req/s beside the ideals, its misses by cause, load and worker."""
    exp = pooled.exp
    run = simulate(exp.with_policy("tropical+").at_rate(rate / exp.trace.mean_rate))
    requests = run.requests
    causes = Counter(miss_cause(r) for r in requests)
    span = max(r.finish or r.arrival for r in requests)
    ideal = [pooled.servers_attainment(rate, count) for count in range(1, pooled.workers + 1)]
    in_time = sum(r.first_token is not None and ttft(r) <= r.slo.ttft for r in requests) / len(requests)
    shares = speed_shares(run.worker_stats)
    return {
        "rate_rps": rate,
        "kserver_ttft_attainment": ideal[-1],
        "pooled_ttft_attainment": pooled.attainment(rate),
        "ideal_servers_ttft_attainment": ideal,
        "quantum_s": quantum,
        "kserver_quantum_ttft_attainment": pooled.servers_attainment(rate, pooled.workers, quantum),
        "kserver_no_preemption_ttft_attainment": pooled.servers_attainment(rate, pooled.workers, math.inf),
        "kserver_bound_ttft_attainment": pooled.bound_attainment(rate),
        "kserver_bound_no_preemption_ttft_attainment": pooled.bound_attainment(rate, preemptive=False),
        "kserver_soonest_no_preemption_ttft_attainment": pooled.bound_attainment(rate, preemptive=False,
                                                                                 soonest=True),
        "speed_shares": shares,
        "kserver_soonest_measured_speeds_ttft_attainment": None if shares is None else
        pooled.bound_attainment(rate, preemptive=False, soonest=True, shares=shares),
        "ttft_attainment": in_time, "worth_servers": worth_servers(in_time, ideal),
        "attainment": run.summary.attainment, "stream_attainment": run.summary.stream_attainment,
        "causes": {c: causes[c] / len(requests) for c in CAUSES},
        "by_load": by_load(requests, window_loads(pooled, rate, window), window),
        "by_worker": by_worker(requests),
        "by_length": by_length(requests),
        "by_tenth": by_tenth(requests),
        "span_s": span,
        "last_arrival_s": max(r.arrival for r in requests),
        "busy": [{"role": role.value, "busy": s.busy / span, "prompt_tokens": s.prompt_tokens,
                  "prefill_busy": s.prefill_busy / span, "prefill_rate": s.prefill_rate}
                 for role, s in zip(run.roles, run.worker_stats, strict=True)],
        "prefix_hit_rate": run.summary.prefix_hit_rate,
    }


def speed_shares(stats: Sequence[WorkerStats]) -> list[float] | None:
    """Each worker's prompt tokens per second in its iterations that prefill, as a share of the
    fastest worker's (None if a worker never prefilled): the speeds at which ideal servers serve
    prompts as these workers did."""
    rates = [s.prefill_rate for s in stats]
    return None if min(rates) <= 0 else [rate / max(rates) for rate in rates]


def by_length(requests: Sequence[Request]) -> list[dict]:
    """Miss rate and share of misses in each quartile of prompt length."""
    ranked = sorted(requests, key=lambda r: r.prompt_len)
    missed = sum(miss_cause(r) is not None for r in requests)
    rows = []
    for q in range(4):
        part = ranked[q * len(ranked) // 4:(q + 1) * len(ranked) // 4]
        misses = sum(miss_cause(r) is not None for r in part)
        rows.append({"prompts": f"{part[0].prompt_len}-{part[-1].prompt_len}",
                     "misses": misses / max(1, missed), "missed_there": misses / len(part)})
    return rows


def by_tenth(requests: Sequence[Request]) -> list[float]:
    """Miss rate in each tenth of the requests, in arrival order."""
    ranked = sorted(requests, key=lambda r: r.arrival)
    tenths = [ranked[k * len(ranked) // 10:(k + 1) * len(ranked) // 10] for k in range(10)]
    return [sum(miss_cause(r) is not None for r in part) / max(1, len(part)) for part in tenths]


def study(trace: str, policies: list[str], window: float, past: float, quantum: float,
          processes: int) -> dict:
    base = experiment(SimConfig(trace=trace).with_preset())
    pooled = PooledCluster.of(base)
    ideals, pooled_cap = pooled.ideal_capacities(), pooled.capacity()
    kserver = ideals["k servers"]
    found = capacities({p: base.with_policy(p) for p in policies}, processes=processes, progress=None)
    own = found["tropical+"].capacity_rps
    hits = cache_hits(base) or [0]
    return {
        "at_own_reuse": {p: own_reuse(base.with_policy(p), c.result.rate_scale) for p, c in found.items()},
        "at_cluster_kv": at_cluster_kv(base),
        "ideal_prefix_hit_rate": hit_share(base, hits),
        "trace": trace, "requests": len(base.trace), "workers": pooled.workers,
        "bound_rps": pooled.bound.rate_rps, "pooled_bound_rps": pooled_cap, "kserver_bound_rps": kserver,
        "capacity_rps": {p: c.capacity_rps for p, c in found.items()},
        "ideal_capacity_rps": ideals,
        "decomposed": {"the k-server bound": decompose(pooled, kserver, window, quantum),
                       f"{past:g}x tropical+'s capacity": decompose(pooled, past * own, window, quantum)},
    }


def own_reuse(exp: Experiment, scale: float) -> dict:
    """The bounds had every prompt the hit it had in ``exp``'s run at rate scale ``scale`` (its
    capacity): how much of the gap to the ideal cache's bounds is reuse, not scheduling."""
    run = simulate(exp.at_rate(scale))
    pooled = PooledCluster.of(exp, run.hits)
    return {"prefix_hit_rate": run.summary.prefix_hit_rate, "bound_rps": pooled.bound.rate_rps,
            "kserver_bound_rps": pooled.kserver_capacity()}


CLUSTER_KV_CACHES = {"kv": "the cluster's KV, furthest next use evicted first",
                     "kv_lru": "the cluster's KV, least recently used evicted first"}
"""The ideal caches of ``sim.reproduce.IDEAL_CACHES`` bounded by the cluster's KV, as named here."""


def at_cluster_kv(base: Experiment) -> dict:
    """The bounds had every prompt the hit one cluster-wide cache the size of the cluster's KV
    gives it, for each of ``CLUSTER_KV_CACHES`` (empty when the cache is off)."""
    out = {}
    for name in CLUSTER_KV_CACHES:
        hits = cache_hits(base, *IDEAL_CACHES[name])
        if hits is not None:
            pooled = PooledCluster.of(base, hits)
            out[name] = {"prefix_hit_rate": hit_share(base, hits), "bound_rps": pooled.bound.rate_rps,
                         "kserver_bound_rps": pooled.kserver_capacity()}
    return out


def cluster_kv_markdown(r: dict) -> list[str]:
    """The bounds at the reuse the cluster's KV allows, with each policy's share of them (none
    where the trace has no reuse: they are the bounds above)."""
    caps, at = r["capacity_rps"], r.get("at_cluster_kv") or {}
    if not any(o["prefix_hit_rate"] for o in at.values()):
        return []
    return ["", "The bounds priced at the reuse one cluster-wide cache the size of the cluster's KV "
            "gives (the first evicting clairvoyantly, the second as the engines do), and each "
            "policy's share of their k-server bound:", "",
            render(["cache", "prefix hit rate", "work bound (req/s)", "k-server bound (req/s)", *caps],
                   [[CLUSTER_KV_CACHES[name], f"{o['prefix_hit_rate']:.1%}", f"{o['bound_rps']:.3f}",
                     f"{o['kserver_bound_rps']:.3f}",
                     *(f"{c / o['kserver_bound_rps']:.0%}" for c in caps.values())]
                    for name, o in at.items()])]


def markdown(r: dict) -> str:
    caps, k, pooled = r["capacity_rps"], r["kserver_bound_rps"], r["pooled_bound_rps"]
    return "\n".join([f"### {r['trace']} ({r['requests']} requests, {r['workers']} workers)", "",
                      f"Work bound {r['bound_rps']:.3f} req/s, k-server bound {k:.3f}, pooled bound "
                      f"{pooled:.3f}. The bounds price every prompt less its hit on one unbounded "
                      f"cluster-wide cache: {r['ideal_prefix_hit_rate']:.1%} of prompt tokens.", "",
                      render(["policy", "capacity (req/s)", "of k-server bound", "of pooled bound"],
                             [[p, f"{c:.3f}", f"{c / k:.0%}", f"{c / pooled:.0%}"] for p, c in caps.items()]),
                      "", "Each policy against the bounds priced at its own reuse (every prompt less the "
                      "hit it had at the policy's capacity), which the policy's caches allow it:", "",
                      render(["policy", "prefix hit rate", "work bound (req/s)", "k-server bound (req/s)",
                              "capacity of the k-server bound"],
                             [[p, f"{o['prefix_hit_rate']:.1%}", f"{o['bound_rps']:.3f}",
                               f"{o['kserver_bound_rps']:.3f}", f"{caps[p] / o['kserver_bound_rps']:.0%}"]
                              for p, o in r["at_own_reuse"].items()]),
                      *cluster_kv_markdown(r),
                      "", "Each variant of the k-server ideal, its capacity and each policy's share of it:",
                      "",
                      render(["ideal", "capacity (req/s)", *caps],
                             [[name, f"{ideal:.3f}", *(f"{c / ideal:.0%}" for c in caps.values())]
                              for name, ideal in r["ideal_capacity_rps"].items()]),
                      "", *(decomposed_markdown(label, at) for label, at in r["decomposed"].items())])


def decomposed_markdown(label: str, at: dict) -> str:
    lines = [f"At {label} ({at['rate_rps']:.3f} req/s): the k servers meet "
             f"{at['kserver_ttft_attainment']:.1%} of TTFT SLOs, the pooled server "
             f"{at['pooled_ttft_attainment']:.1%}; `tropical+` attains {at['attainment']:.1%} "
             f"({at['stream_attainment']:.1%} stream).", "",
             "Why requests miss (share of all requests):", "",
             render(list(CAUSES), [[f"{at['causes'][c]:.1%}" for c in CAUSES]]), "",
             "When: windows by their prompt load (work arriving over what the k servers do):", "",
             render(["window load", "of arrivals", "of misses", "missed there"],
                    [[b["load"], f"{b['arrivals']:.1%}", f"{b['misses']:.1%}", f"{b['missed_there']:.1%}"]
                     for b in at["by_load"]]), "",
             "Where: the worker that prefilled each request, by path:", "",
             render(["worker", "path", "of prompts", "of misses", "missed there"],
                    [[str(w["worker"]), w["path"], f"{w['prompts']:.1%}", f"{w['misses']:.1%}",
                      f"{w['missed_there']:.1%}"] for w in at["by_worker"]]), "",
             "What: prompt length, by quartile of the trace:", "",
             render(["prompt tokens", "of misses", "missed there"],
                    [[b["prompts"], f"{b['misses']:.1%}", f"{b['missed_there']:.1%}"]
                     for b in at["by_length"]]), "",
             "Over the run: miss rate by tenth of the arrivals "
             + ", ".join(f"{m:.0%}" for m in at["by_tenth"])
             + f"; last finish {at['span_s']:.0f} s after the first arrival, last arrival "
             f"{at['last_arrival_s']:.0f} s; prefix hit rate {at['prefix_hit_rate']:.1%}; busy share of "
             "the run by worker, with the share in iterations that prefill and the prompt tokens "
             "computed per second in those: "
             + ", ".join(f"{i} ({w['role']}) {w['busy']:.0%} ({w['prefill_busy']:.0%}, "
                         f"{w['prefill_rate']:,.0f}/s)" for i, w in enumerate(at["busy"])) + ".", "",
             "Against part of the ideal (TTFT SLOs met):", "",
             render(["ideal", "TTFT attainment"], ideal_rows(at)), "",
             f"`tropical+` meets {at['ttft_attainment']:.1%} of TTFT SLOs: what "
             f"{at['worth_servers']:.2f} of the {len(at['ideal_servers_ttft_attainment'])} ideal servers "
             "meet.", ""]
    return "\n".join(lines)


def ideal_rows(at: dict) -> list[list[str]]:
    ideal = at["ideal_servers_ttft_attainment"]
    rows = [[f"{count} server{'s' if count > 1 else ''}, preemptive", f"{share:.1%}"]
            for count, share in enumerate(ideal, 1)]
    return rows + [[f"{len(ideal)} servers, a prompt preempted after {at['quantum_s']:g} s",
                    f"{at['kserver_quantum_ttft_attainment']:.1%}"],
                   [f"{len(ideal)} servers, never preempted",
                    f"{at['kserver_no_preemption_ttft_attainment']:.1%}"],
                   [f"{len(ideal)} servers, each prompt bound at arrival to the least loaded",
                    f"{at['kserver_bound_ttft_attainment']:.1%}"],
                   [f"{len(ideal)} servers, bound at arrival, never preempted",
                    f"{at['kserver_bound_no_preemption_ttft_attainment']:.1%}"],
                   [f"{len(ideal)} servers, bound where it starts soonest, never preempted",
                    f"{at['kserver_soonest_no_preemption_ttft_attainment']:.1%}"]] + (
        [] if at["speed_shares"] is None else
        [["the same, each server at its worker's measured prefill speed ("
          + ", ".join(f"{share:.2f}" for share in at["speed_shares"]) + ")",
          f"{at['kserver_soonest_measured_speeds_ttft_attainment']:.1%}"]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="synthetic,azure-code")
    parser.add_argument("--policies", default="tropical+,chunked-512,kv-router")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per arrival window")
    parser.add_argument("--past", type=float, default=1.5,
                        help="also decompose at this multiple of tropical+'s capacity")
    parser.add_argument("--quantum", type=float, default=0.1,
                        help="seconds a prompt keeps its ideal server once started, for the ideal that "
                             "preempts only between iterations")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    policies = args.policies.split(",")
    results = [study(t, policies, args.window, args.past, args.quantum, args.processes)
               for t in args.traces.split(",")]
    print(json.dumps(results) if args.json else "\n".join(markdown(r) for r in results))


if __name__ == "__main__":
    main()
