"""The reproduction's markdown report: tables of what was measured, and sentences computed
from those numbers only (no sentence states a finding the run did not produce)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tropical.core.metrics import miss_cause
from tropical.sched.registry import PLUS_PREFILL_BUDGET, PLUS_PREFILL_PIECE, PLUS_SIZE_WEIGHT
from tropical.sim.overload import MODES
from tropical.sim.reproduce import ABLATION, CURVE_FLOOR, AtRate, Reproduction, Study, is_baseline, ratio

DISPATCH = {
    "colocated": "fewest unfinished tokens",
    "kv": "Dynamo's KV-router cost: uncached prompt blocks + queued prompt blocks + active KV blocks",
    "kv-router-disagg": "decode: fewest unfinished tokens, which prefills locally when at most 1,000 "
                        "tokens are uncached there; else prefill: Dynamo's KV-router cost",
    "disagg": "prefill: fewest unfinished tokens; decode: fewest unfinished tokens with room",
    "tropical": "Path 1: earliest predicted prefill finish; Path 2 when TTFT is at risk; decode: "
                "fewest unfinished tokens among workers whose TPOT budget holds",
    "tropical+": "Path 1: earliest finish at the prompt's place in each prefill queue (queued by TTFT "
                 f"deadline + {PLUS_SIZE_WEIGHT:g}x its own prefill; a prompt longer than "
                 f"{PLUS_PREFILL_PIECE:,} tokens runs in pieces, its rest queued again by its key), its "
                 "cached prefix not recomputed; Path 2 when TTFT is at risk behind that queue; "
                 "decode: fewest unfinished tokens among workers whose TPOT budget holds",
}
CAUSES = ("TTFT queueing", "TTFT execution", "TPOT", "stall", "failed")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def dispatch_of(policy: str) -> str:
    return DISPATCH.get(policy, DISPATCH.get(policy.split("-")[0], DISPATCH["colocated"]))


def capacity_section(rep: Reproduction) -> str:
    ratios, streams = rep.ratio_vs_best_baseline(), rep.stream_ratio_vs_best_baseline()
    rows = [[p, f"{c.capacity_rps:.3f}", _shares(rep, c.capacity_rps), f"{ratios[p]:.2f}x",
             f"{c.stream_capacity_rps:.3f}", _shares(rep, c.stream_capacity_rps),
             f"{streams[p]:.2f}x", dispatch_of(p)]
            for p, c in rep.capacity.items()]
    b = rep.bound
    return ("## Goodput capacity (≥ 90% of requests attain)\n\n"
            + _table(["policy", "capacity (req/s)", "of work / k-server / pooled bound", "vs best baseline",
                      "stream capacity (req/s)", "of work / k-server / pooled bound", "vs best baseline",
                      "dispatch"], rows)
            + f"\n\nBest baseline: **{rep.best_baseline}** (paper's metric), "
            f"**{rep.best_stream_baseline}** (stream attainment), the best of every baseline "
            f"variant. Bisection to {rep.capacity[rep.best_baseline].result.rel_tol:.0%} relative "
            f"tolerance. Work bound: **{b.rate_rps:.3f} req/s** ({b.workers} workers; per request "
            f"{b.prefill_s:.3f} s of prefill alone and {b.decode_s:.3f} s of decode; the median "
            f"request decodes at batch {b.batch}, the largest that the KV cache holds for the "
            "trace's mean request and that keeps the request's TPOT SLO). Pooled bound: "
            f"**{rep.pooled_rps:.3f} req/s**, the highest rate at which 90% of requests meet their "
            "TTFT SLO with the trace's bursts kept, on an ideal cluster: every worker pooled into "
            "one server that many times as fast, prompts earliest deadline first, one that can no "
            "longer make it yielding, decodes as a steady tax at the work bound's cost (an ideal "
            f"to measure against, not a proof). K-server bound: **{rep.kserver_rps:.3f} req/s**, the "
            "same with one server per worker at a worker's speed, each prompt on one server at a "
            "time: the ideal for policies that run a prompt on one worker (the gap up to the pooled "
            "bound is what splitting a prompt's prefill across workers could win).\n")


def prefix_section(rep: Reproduction) -> str:
    """Prefix reuse per policy at its own capacity, against what ideal caches would reuse."""
    if not rep.base.prefix_cache:
        return ""
    rows = [[p, f"{at.result.summary.prefix_hit_rate:.1%}",
             " / ".join(f"{s.prefix_hit_rate:.0%}" for s in at.result.worker_stats),
             f"{at.result.kv_migrated_bytes_per_request / 2**20:.0f}",
             f"{rep.reuse_bound[p]:.3f}", f"{ratio(rep.capacity[p].capacity_rps, rep.reuse_bound[p]):.0%}"]
            for p, at in rep.at_own.items()]
    ideal = rep.ideal_hit_rate
    return ("## Prefix caching (each policy at its own capacity)\n\n"
            + _table(["policy", "prefix hit rate", "per worker", "KV migrated per request (MiB)",
                      "work bound at its own reuse (req/s)", "capacity of it"], rows)
            + f"\n\nHit rate: prompt tokens found in the prefilling worker's cache over all prompt "
            f"tokens prefilled. One ideal cluster-wide cache that keeps everything would reuse "
            f"{ideal.get('infinite', 0):.1%} of the trace's prompt tokens (the work bound above "
            f"assumes it); one the size of the cluster's KV, evicting what is needed furthest in the "
            f"future, {ideal.get('kv', 0):.1%} (its work bound: {rep.ideal_bound.get('kv', 0):.3f} req/s), "
            f"or least recently used first, as the engines' caches do, {ideal.get('kv_lru', 0):.1%} "
            f"(its work bound: {rep.ideal_bound.get('kv_lru', 0):.3f} req/s). "
            "The work bound at a policy's own reuse prices every request less the hit it had in "
            "that policy's run: the gap between it and the work bound is what more reuse could "
            "win, the gap between it and the capacity what scheduling could.\n")


def paper_setting_section(rep: Reproduction) -> str:
    """The paper's policies with every prompt computed whole, as the paper ran them."""
    if rep.paper is None:
        return ""
    study = rep.paper
    (variant, caps), = study.capacity.items()
    ratios, streams = study.ratios()[variant], study.ratios(stream=True)[variant]
    bound, pooled, kserver = study.bound[variant], study.pooled[variant], study.kserver[variant]
    rows = [[p, f"{c:.3f}", f"{c / bound:.0%} / {ratio(c, kserver):.0%} / {ratio(c, pooled):.0%}",
             f"{ratios[p]:.2f}x",
             f"{study.stream[variant][p]:.3f}", f"{streams[p]:.2f}x"] for p, c in caps.items()]
    return ("## The paper's setting: no prefix cache\n\n"
            + _table(["policy", "capacity (req/s)", "of work / k-server / pooled bound", "vs best baseline",
                      "stream capacity (req/s)", "vs best baseline"], rows)
            + f"\n\nEvery prompt computed whole, as in the paper: work bound {bound:.3f} req/s, k-server "
            f"bound {kserver:.3f} req/s, pooled bound {pooled:.3f} req/s.\n\n![capacities](capacities.png)\n")


def _shares(rep: Reproduction, rate: float) -> str:
    return (f"{rep.bound.share(rate):.0%} / {ratio(rate, rep.kserver_rps):.0%} / "
            f"{ratio(rate, rep.pooled_rps):.0%}")


def deferral_section(rep: Reproduction) -> str:
    rows = []
    for p, at in rep.at_own.items():
        s = at.result.summary
        rows.append([p, f"{at.result.experiment.rate_scale * rep.base.trace.mean_rate:.3f}",
                     f"{at.queued_s / rep.bound.workers:.0f}", f"{at.queued_share:.2%}",
                     f"{at.unwaited_share:.2%}", f"{_missed(at):.0%}", f"{s.ttft.p90:.2f}",
                     f"{s.ttft.p99:.2f}", f"{s.ttft_max:.1f}",
                     f"{s.stall_share:.1%}", f"{s.itl.p99 * 1e3:.0f}"])
    return ("## Each policy at its own capacity: is work deferred past the trace's end?\n\n"
            + _table(["policy", "rate (req/s)", "work queued at last arrival (s, whole cluster)",
                      "of the trace's work", "had no request waited", "of it, for requests that miss",
                      "P90 TTFT (s)",
                      "P99 TTFT (s)", "max TTFT (s)", "stall > 1 s", "ITL P99 (ms)"], rows) + "\n")


def common_rate_section(rep: Reproduction) -> str:
    rate = rep.common_scale * rep.base.trace.mean_rate
    rows, causes = [], []
    for p, at in rep.at_common.items():
        run, s = at.result, at.result.summary
        rows.append([p, f"{s.attainment:.1%}", f"{s.stream_attainment:.1%}", f"{s.ttft.p90:.2f}",
                     f"{s.tpot.p90 * 1e3:.1f}", f"{s.itl.p50 * 1e3:.1f}", f"{s.itl.p99 * 1e3:.0f}",
                     f"{s.stall_share:.1%}", f"{at.queued_share:.2%}",
                     ", ".join(f"{k} {v}" for k, v in sorted(s.paths.items()))])
        counts = Counter(miss_cause(r) for r in run.requests)
        causes.append([p] + [f"{counts[c] / len(run.requests):.1%}" for c in CAUSES])
    return (f"## Latency at a common rate: {rate:.3f} req/s (the best baseline's capacity)\n\n"
            + _table(["policy", "attainment", "stream attainment", "P90 TTFT (s)", "P90 TPOT (ms)",
                      "ITL P50 (ms)", "ITL P99 (ms)", "stall > 1 s",
                      "work queued at last arrival", "prefill paths"], rows)
            + "\n\nWhy requests miss stream attainment (share of all requests; a TTFT miss is "
            "*queueing* when the wait for the prefill to start exceeds the prefill's own time):\n\n"
            + _table(["policy", *CAUSES], causes)
            + "\n\n![attainment](attainment_vs_rate.png)\n\n"
            f"Points under {CURVE_FLOOR:.0%} attainment are lower bounds: those runs stop once the "
            "outcome is certain.\n\n![latency CDFs](latency_cdfs.png)\n\n![queueing](queueing.png)\n")


def study_section(study: Study) -> str:
    ratios, streams = study.ratios(), study.ratios(stream=True)
    policies = sorted({p for caps in study.capacity.values() for p in caps},
                      key=lambda p: (not is_baseline(p), p))
    rows = [[variant, f"{study.bound[variant]:.3f} ({study.headroom(variant):.2f}x / "
                      f"{study.headroom(variant, stream=True):.2f}x)",
             f"{study.kserver[variant]:.3f}",
             f"{study.pooled[variant]:.3f} ({study.headroom(variant, pooled=True):.2f}x / "
             f"{study.headroom(variant, stream=True, pooled=True):.2f}x)"]
            + [f"{caps[p]:.3f} ({ratios[variant][p]:.2f}x) / "
               f"{study.stream[variant][p]:.3f} ({streams[variant][p]:.2f}x)"
               if p in caps else "–" for p in policies]
            for variant, caps in study.capacity.items()]
    return (f"### {study.title}\n\nEach cell: capacity (vs the best baseline of the row) under the "
            "paper's metric / under stream attainment. The work bound's ratio is the most any policy "
            "could reach over the row's best baseline without deferring work; the pooled bound's, "
            "the most an ideal cluster reaches with the trace's bursts kept.\n\n"
            + _table([study.title, "work bound (most vs best baseline)", "k-server bound",
                      "pooled bound (most vs best baseline)", *policies], rows) + "\n"
            + "".join(f"\n*{variant}*: {note}.\n" for variant, note in study.notes.items()))


def analysis_section(rep: Reproduction) -> str:
    """Sentences whose every number and comparison comes from this run."""
    return "## Analysis\n\n" + "\n\n".join(
        [_verdict(rep), _bound_sentence(rep), *_reuse_sentences(rep), _deferral_sentence(rep),
         _misses_sentence(rep),
         _slack_sentence(rep), *_ablation_sentences(rep), *_headroom_sentences(rep)]) + "\n"


def _verdict(rep: Reproduction) -> str:
    paper, stream = rep.ratio_vs_best_baseline(), rep.stream_ratio_vs_best_baseline()
    parts = []
    for p in ("tropical", "tropical+"):
        word = "beats" if min(paper[p], stream[p]) > 1 else ("loses to" if max(paper[p], stream[p]) < 1
                                                            else "splits with")
        parts.append(f"`{p}` {word} the best baseline: {paper[p]:.2f}x `{rep.best_baseline}` under "
                     f"the paper's metric and {stream[p]:.2f}x `{rep.best_stream_baseline}` under "
                     "stream attainment")
    return "**Verdict.** " + "; ".join(parts) + "."


def _bound_sentence(rep: Reproduction) -> str:
    shares = {p: rep.bound.share(c.capacity_rps) for p, c in rep.capacity.items()}
    top = max(shares, key=lambda p: shares[p])
    best = rep.best_baseline
    plus_stream = rep.bound.share(rep.capacity["tropical+"].stream_capacity_rps)
    pooled = {p: ratio(rep.capacity[p].capacity_rps, rep.pooled_rps) for p in (best, "tropical+")}
    return (f"**Against the physical limit.** The work bound is {rep.bound.rate_rps:.3f} req/s; the "
            f"best baseline reaches {shares[best]:.0%} of it, `tropical+` "
            f"{shares['tropical+']:.0%} ({plus_stream:.0%} under stream attainment), and the highest "
            f"share is `{top}`'s {shares[top]:.0%}. The pooled bound, with the trace's bursts kept, "
            f"is {rep.pooled_rps:.3f} req/s ({ratio(rep.pooled_rps, rep.bound.rate_rps):.0%} of the "
            f"work bound): the best baseline reaches {pooled[best]:.0%} of it, `tropical+` "
            f"{pooled['tropical+']:.0%}. The k-server bound, each prompt on one worker, is "
            f"{rep.kserver_rps:.3f} req/s: `tropical+` reaches "
            f"{ratio(rep.capacity['tropical+'].capacity_rps, rep.kserver_rps):.0%} of it.")


def _reuse_sentences(rep: Reproduction) -> list[str]:
    """How much each side reused, against the ideal caches, and how far reuse and scheduling
    each leave ``tropical+`` from the bound (nothing without a cache)."""
    if not rep.base.prefix_cache:
        return []
    hits = {p: at.result.summary.prefix_hit_rate for p, at in rep.at_own.items()}
    router = max((p for p in hits if p.startswith("kv-router")), key=lambda p: hits[p], default=None)
    best, plus = rep.best_baseline, "tropical+"
    routers = f", the best cache-aware router `{router}` {hits[router]:.1%}" if router else ""
    capacity, reuse, bound = rep.capacity[plus].capacity_rps, rep.reuse_bound[plus], rep.bound.rate_rps
    return [f"**Reuse.** At their capacities `{plus}` finds {hits[plus]:.1%} of its prompt tokens in a "
            f"worker's cache, the best baseline `{best}` {hits[best]:.1%}{routers}; one ideal "
            f"cluster-wide cache would find {rep.ideal_hit_rate['infinite']:.1%} (the work bound assumes "
            f"it), and one the size of the cluster's KV, evicting what is needed furthest ahead, "
            f"{rep.ideal_hit_rate['kv']:.1%}. Priced at the reuse its own run had, the work bound is "
            f"{reuse:.3f} req/s against {bound:.3f}: `{plus}` reaches {ratio(capacity, reuse):.0%} of "
            + (f"it, so of the {1 - ratio(capacity, bound):.0%} of the work bound it leaves, reuse accounts "
               f"for {1 - ratio(reuse, bound):.0%} and scheduling for {ratio(reuse - capacity, bound):.0%}."
               if capacity <= reuse else
               "it: past what its cluster can do for every request at that reuse, which only work "
               "deferred past the trace's end allows (see **Deferral**).")]


def _deferral_sentence(rep: Reproduction) -> str:
    best, plus = rep.at_own[rep.best_baseline], rep.at_own["tropical+"]
    common_best, common_plus = rep.at_common[rep.best_baseline], rep.at_common["tropical+"]
    return (f"**Deferral.** At its capacity `tropical+` leaves {plus.queued_share:.2%} of the trace's "
            f"work queued when the last request arrives, {_more(plus, best)} than "
            f"`{rep.best_baseline}` at its own ({best.queued_share:.2%}); at those rates serving "
            f"every request from its arrival without waiting would leave {plus.unwaited_share:.2%} "
            f"and {best.unwaited_share:.2%} in flight, so {_excess(plus):.2%} against "
            f"{_excess(best):.2%} is queueing{_floor_clause(plus, best, rep.best_baseline)}. Of the "
            f"queued work {_missed(plus):.0%} (against {_missed(best):.0%}) is for requests that go "
            "on to miss their SLOs, the "
            "rest for requests delayed within their TTFT slack; its P99 TTFT there is "
            f"{plus.result.summary.ttft.p99:.1f} s against {best.result.summary.ttft.p99:.1f} s. At "
            f"the common rate it leaves {common_plus.queued_share:.2%} "
            f"({_missed(common_plus):.0%} of it for requests that miss), "
            f"{_more(common_plus, common_best)} than `{rep.best_baseline}` "
            f"({common_best.queued_share:.2%}; {_missed(common_best):.0%}).")


def _floor_clause(plus: AtRate, best: AtRate, name: str) -> str:
    """Is the work merely in flight at ``plus``'s rate already more than ``best`` leaves queued?"""
    if plus.unwaited_s <= best.queued_s:
        return ""
    return (f" (at `tropical+`'s rate the work in flight had no request waited is already more than "
            f"`{name}` leaves queued at its own)")


def _excess(at: AtRate) -> float:
    """Queued work beyond what was only in flight, as a share of the trace's work."""
    return at.queued_share - at.unwaited_share


def _missed(at: AtRate) -> float:
    return at.missed_s / at.queued_s if at.queued_s else 0.0


def _more(one: AtRate, other: AtRate) -> str:
    return "more" if one.queued_s > other.queued_s else "no more"


def _misses_sentence(rep: Reproduction) -> str:
    parts = []
    for p in (rep.best_baseline, "tropical", "tropical+"):
        run = rep.at_common[p].result
        counts = Counter(miss_cause(r) for r in run.requests)
        counts.pop(None, None)
        if counts:
            cause, n = counts.most_common(1)[0]
            parts.append(f"`{p}` misses {sum(counts.values()) / len(run.requests):.1%} of requests, "
                         f"most for {cause} ({n / len(run.requests):.1%})")
        else:
            parts.append(f"`{p}` misses none")
    return "**Misses at the common rate.** " + "; ".join(parts) + "."


def _slack_sentence(rep: Reproduction) -> str:
    s = rep.slack
    return (f"**Per-iteration slack.** A prefill costs {s['prefill_ms_per_token']:.3f} ms per token "
            f"on the reference replica; a decode iteration of 32 requests at 8k context takes "
            f"{s['decode_iteration_s_batch32'] * 1e3:.1f} ms against the median request's TPOT SLO "
            f"of {s['tpot_slo_s'] * 1e3:.1f} ms, so one iteration admits a prefill of at most "
            f"{s['admissible_prefill_tokens_batch32']:.0f} tokens beside 32 decodes "
            f"({s['admissible_prefill_tokens_batch8']:.0f} beside 8); "
            f"{s['requests_within_batch32_budget']:.1%} ({s['requests_within_batch8_budget']:.1%}) of "
            f"prompts fit whole (median {s['median_prompt_tokens']:.0f} tokens). Chunked multiplexing "
            "spends the same per-iteration slack on any prompt, a chunk per iteration.")


def _ablation_sentences(rep: Reproduction) -> list[str]:
    study = next((s for s in rep.studies if s.title == "ablation"), None)
    if study is None:
        return []
    paper = study.ratios()
    stream = study.ratios(stream=True)
    rows = [f"{name}: {paper[name]['tropical']:.2f}x / {stream[name]['tropical']:.2f}x"
            for name in ABLATION if name in paper]
    return ["**Mechanisms one by one** (toggle capacity vs the best baseline on the slice, paper's "
            "metric / stream attainment): " + "; ".join(rows) + "."]


def _headroom_sentences(rep: Reproduction) -> list[str]:
    """How far each sensitivity row's best baseline is from its bound, and how much of the bound
    ``tropical+`` takes, at the extremes."""
    if not any("tropical+" in caps for s in rep.studies for caps in s.capacity.values()):
        return []
    return [_headroom_sentence(rep, pooled) for pooled in (False, True)]


def _headroom_sentence(rep: Reproduction, pooled: bool) -> str:
    rows = {(s.title, v): (s.headroom(v, pooled=pooled),
                           ratio(s.capacity[v]["tropical+"], (s.pooled if pooled else s.bound)[v]))
            for s in rep.studies for v in s.capacity if "tropical+" in s.capacity[v]}
    least = min(rows, key=lambda k: rows[k][0])
    most = max(rows, key=lambda k: rows[k][0])
    low = min(rows, key=lambda k: rows[k][1])
    high = max(rows, key=lambda k: rows[k][1])
    name, meaning = (("pooled bound", "what an ideal cluster reaches over the best baseline there "
                      "with the trace's bursts kept (an ideal, not a proof)") if pooled else
                     ("work bound", "no policy can beat the best baseline by more there without "
                      "deferring work"))
    return (f"**Headroom in the sensitivity rows** (paper's metric, {name}). The {name} is "
            f"{rows[least][0]:.2f}x the best baseline in {_row(least)} and up to {rows[most][0]:.2f}x "
            f"in {_row(most)}: {meaning}. "
            f"`tropical+` reaches {rows[low][1]:.0%} of the bound in {_row(low)} and up to "
            f"{rows[high][1]:.0%} in {_row(high)}.")


def overload_section(rep: Reproduction) -> str:
    """Goodput past capacity, each policy under each admission mode, as a share of the work bound,
    with the refusals per arrival by reason."""
    if rep.overload is None:
        return ""
    past = rep.overload
    multiples = sorted({m for modes in past.points.values() for runs in modes.values() for m in runs})
    rows = []
    for policy, modes in past.points.items():
        for mode, runs in modes.items():
            rows.append([policy, mode, *(f"{runs[m].goodput_rps / past.bound_rps:.0%}" for m in multiples),
                         *(_refusals(runs[m].rejected) for m in multiples)])
    heads = [f"{m:g}x the bound" for m in multiples]
    return ("## Past capacity: goodput under each admission mode\n\n"
            f"Requests attained per second of the run at multiples of the work bound "
            f"({past.bound_rps:.3f} req/s), as a share of it; a refused request is a miss (attainment "
            "counts every arrival). `early-reject` refuses what no path is predicted to serve within "
            "its TTFT SLO, at arrival or while still queued with nothing computed; `predictive` also "
            "what the decode load predicted for its prefill's end would push past its TPOT SLO (on "
            "average) or its TBT SLO (in one iteration), or past that of the requests decoding "
            "there.\n\n"
            + _table(["policy", "admission", *(f"goodput, {h}" for h in heads),
                      *(f"refused, {h}" for h in heads)], rows) + "\n")


def admission_section(rep: Reproduction) -> str:
    """Each policy's capacity when it refuses what it predicts it cannot serve in time: the
    comparison that no policy wins by leaving requests queued for as long as the trace lasts."""
    if not rep.admitted:
        return ""
    ratios = rep.admission_ratio_vs_best_baseline()
    rows = []
    for p in rep.capacity:
        rps = rep.by_admission(p)
        mode, best = rep.with_admission(p)
        rows.append([p, *(f"{rps[m]:.3f}" for m in MODES), mode, _shares(rep, best), f"{ratios[p]:.2f}x"])
    return ("## Capacity with admission\n\n"
            "Each policy's goodput capacity (≥ 90% of arrivals attain, a refused request counted as "
            "a miss) under each `--admission` mode, req/s. Admitting everything, a policy may reach "
            "its capacity by leaving the requests it cannot serve in time queued until the trace "
            "ends (the deferral above); with admission they are refused instead, and count as "
            "misses.\n\n"
            + _table(["policy", *MODES, "best mode", "of work / k-server / pooled bound",
                      "vs best baseline (each in its best mode)"], rows)
            + "\n\n" + _admission_sentences(rep) + "\n")


def _admission_sentences(rep: Reproduction) -> str:
    """The best baseline with admission, each other policy against it, and every capacity that
    admission lowers (computed from the run)."""
    base = rep.best_admitting_baseline
    mode, best = rep.with_admission(base)
    ratios = rep.admission_ratio_vs_best_baseline()
    chosen = {p: rep.with_admission(p) for p in rep.capacity if not is_baseline(p)}
    others = [f"`{p}` {capacity:.3f} ({how}), {ratios[p]:.2f}x it" for p, (how, capacity) in chosen.items()]
    lowered = [f"`{p}` with `{m}` ({c / rep.capacity[p].capacity_rps:.3f}x)"
               for p, admitted in rep.admitted.items() for m, c in admitted.items()
               if c < rep.capacity[p].capacity_rps]
    return (f"**Best baseline with admission**: `{base}` with `{mode}`, {best:.3f} req/s; "
            + "; ".join(others) + ". "
            + ("Admission lowers: " + ", ".join(lowered) + "." if lowered
               else "Admission lowers no policy's capacity."))


def _refusals(rejected: dict[str, float]) -> str:
    """Refusals per arrival, by reason."""
    if not rejected:
        return "none"
    return ", ".join(f"{reason} {share:.0%}" for reason, share in sorted(rejected.items()))


def _row(key: tuple[str, str]) -> str:
    return f"{key[0]} *{key[1]}*"


def write_report(rep: Reproduction, out: Path) -> Path:
    """``report.md`` in ``out`` (next to the plots)."""
    exp = rep.base
    head = (f"# Tropical: reproduction on the {exp.cluster.name} cluster\n\n"
            f"Trace `{exp.trace.name}` ({len(exp.trace)} requests, {exp.trace.mean_rate:.3f} req/s "
            f"recorded), {len(exp.cluster.workers)} workers of {exp.cluster.workers[0].replica.model.name} "
            f"on {exp.cluster.workers[0].replica.tp}x {exp.cluster.workers[0].replica.gpu.name}, SLOs at "
            f"{exp.slo.ttft_scale:g}x/{exp.slo.tpot_scale:g}x light-load TTFT/TPOT, TBT SLO "
            f"{exp.slo.tbt_scale:g}x the TPOT SLO (stream attainment also requires every gap between "
            "two tokens within it; a stall is a gap over 1 s). `tropical` is the paper's toggle; "
            "`tropical+` adds chunked multiplexing, orders its queues by TTFT deadline + "
            f"{PLUS_SIZE_WEIGHT:g}x each prompt's own prefill, sends Path 1 where a prompt would finish "
            "soonest at its place in the queue, lets prompts that can no longer meet their TTFT "
            f"yield, batches at most {PLUS_PREFILL_BUDGET:,} prompt tokens per prefill iteration, and "
            f"runs a longer prompt in pieces of {PLUS_PREFILL_PIECE:,} tokens, its rest queued again by "
            "its key after each. "
            + ("Every worker keeps a prefix cache (vLLM's automatic prefix caching: the trace's "
               "hash_ids, least recently freed evicted first); the work and pooled bounds assume one "
               "ideal cluster-wide cache in which every reusable prefix hits. "
               if exp.prefix_cache else "Every prompt is computed whole (`--prefix-cache off`). ")
            + (f"Under each worker's cache, host memory {exp.host_kv:g}x its KV pool keeps the blocks "
               "the pool evicts, loaded back over PCIe when a prompt reuses them (`--host-kv`"
               + ("; `--host-tier shared`: one store of all of it, which every worker loads from). "
                  if exp.host_tier == "shared" else "). ")
               if exp.host_kv else "")
            + "Regenerate with `tropical reproduce`.\n")
    parts = [head, capacity_section(rep), prefix_section(rep), paper_setting_section(rep),
             deferral_section(rep), common_rate_section(rep), admission_section(rep), overload_section(rep),
             analysis_section(rep)]
    if rep.studies:
        parts.append("## Ablation and sensitivity (capacity in req/s on trace slices, and ratio to "
                     "the best baseline in the same setting)\n")
        parts.extend(study_section(s) for s in rep.studies)
    path = out / "report.md"
    path.write_text("\n".join(parts))
    return path
