"""The fidelity study's markdown report, every number taken from the runs: real vs simulated per
policy with the repeats' spread, path agreement and first divergences, the goodput ranking, and
the toggle's goodput against the best baseline."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from itertools import combinations
from typing import Any

from tropical.fidelity.compare import DRIFT, METRICS, STREAM_METRICS
from tropical.fidelity.host import TOLERANCE, far, per_kind
from tropical.fidelity.paths import merge
from tropical.fidelity.repeats import (
    GOODPUT,
    STREAM_GOODPUT,
    PolicyRepeats,
    Spread,
    median_abs_error,
    path_agreement,
)

LABELS = {"ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90", "tpot_p50_s": "TPOT p50",
          "tpot_p90_s": "TPOT p90", "attainment": "attainment", GOODPUT: "goodput (req/s)",
          "itl_p50_s": "ITL p50", "itl_p99_s": "ITL p99", "stall_share": "stall > 1 s",
          "stream_attainment": "stream attainment", STREAM_GOODPUT: "stream goodput (req/s)"}
TOGGLE = "tropical+"
BASELINES = ("colocated", "chunked", "disagg")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [headers, ["---"] * len(headers), *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def fmt(value: float, metric: str) -> str:
    if math.isnan(value):
        return "-"
    if metric in ("attainment", "stall_share", "stream_attainment"):
        return f"{value:.1%}"
    return f"{value:.3f}" if metric in (GOODPUT, STREAM_GOODPUT) else f"{value * 1e3:.0f}"


def cell(spread: Spread, sim: float, error: float, metric: str) -> str:
    """``mean (min..max) / sim error mark``; the mark says whether sim lies within min..max."""
    mark = "✓" if spread.contains(sim) else "✗"
    err = "-" if math.isnan(error) else f"{error:+.0%}"
    return (f"{fmt(spread.mean, metric)} ({fmt(spread.low, metric)}..{fmt(spread.high, metric)}) / "
            f"{fmt(sim, metric)} {err} {mark}")


def numbers_table(policies: Sequence[PolicyRepeats], metrics: Sequence[str] = (*METRICS, GOODPUT)) -> str:
    headers = ["policy", *(LABELS[m] + (" (ms)" if m.endswith("_s") else "") for m in metrics)]
    rows = []
    for p in policies:
        real, sim, err = p.real(), p.sim(), p.errors()
        rows.append([p.policy, *(cell(real[m], sim[m], err[m], m) for m in metrics)])
    return markdown_table(headers, rows)


def paths_table(policies: Sequence[PolicyRepeats]) -> str:
    headers = ["policy", "same path", "first differing request (arrival)", "real path (prefill worker)",
               "twin's path (prefill worker)", "server's reason", "twin's reason"]
    rows = []
    for p in policies:
        paths = p.paths()
        d = paths.first_divergence
        same = f"{paths.same} of {paths.compared} ({_share(paths.agreement)})"
        if d is None:
            rows.append([p.policy, same, "none", "", "", "", ""])
        else:
            rows.append([p.policy, same, f"#{d.id} ({d.arrival_s:.2f} s)",
                         f"{d.real_path} ({d.real_prefill_worker})", f"{d.sim_path} ({d.sim_prefill_worker})",
                         d.real_reason or "-", d.sim_reason or "-"])
    return markdown_table(headers, rows)


def ranking_lines(policies: Sequence[PolicyRepeats]) -> list[str]:
    """Goodput order live and simulated, and whether the simulator orders alike every pair whose
    live spreads do not overlap (pairs that overlap are within the server's own noise)."""
    real = {p.policy: p.real()[GOODPUT] for p in policies}
    sim = {p.policy: p.sim()[GOODPUT] for p in policies}
    separated = [(a, b) for a, b in combinations(real, 2)
                 if real[a].high < real[b].low or real[b].high < real[a].low]
    wrong = [f"{a} vs {b}" for a, b in separated if (real[a].mean > real[b].mean) != (sim[a] > sim[b])]
    order = " > ".join(sorted(real, key=lambda p: -real[p].mean))
    sim_order = " > ".join(sorted(sim, key=lambda p: -sim[p]))
    verdict = "; ordered differently: " + ", ".join(wrong) if wrong else ""
    return [f"Goodput order live (mean of repeats): {order}; simulated: {sim_order}.",
            f"Pairs whose live spreads are separated: {len(separated)}; the simulator orders "
            f"{len(separated) - len(wrong)} of them as the server does{verdict}."]


def toggle_line(policies: Sequence[PolicyRepeats]) -> str:
    """tropical+'s goodput over the best baseline's, live (means of repeats) and simulated, under
    the paper's attainment and under stream attainment."""
    contenders = _contenders(policies)
    if contenders is None:
        return f"({TOGGLE} or every baseline missing from this run: no toggle ratio.)"
    return "\n".join(_toggle_ratio(*contenders, metric, label) for metric, label in
                     ((GOODPUT, "goodput"), (STREAM_GOODPUT, "stream goodput")))


def _contenders(policies: Sequence[PolicyRepeats]) -> tuple[PolicyRepeats, list[PolicyRepeats]] | None:
    """The toggle and the baselines among ``policies``; None without the toggle or any baseline."""
    by_name = {p.policy: p for p in policies}
    baselines = [by_name[b] for b in BASELINES if b in by_name]
    return (by_name[TOGGLE], baselines) if TOGGLE in by_name and baselines else None


def _toggle_ratio(toggle: PolicyRepeats, baselines: Sequence[PolicyRepeats], metric: str, label: str) -> str:
    best_real, live = _live_ratio(toggle, baselines, metric)
    best_sim, simulated = _sim_ratio(toggle, baselines, metric)
    separated = toggle.real()[metric].low > best_real.real()[metric].high
    return (f"{TOGGLE} {label} / best baseline's: live {live} (best baseline {best_real.policy}; "
            f"{TOGGLE}'s lowest repeat {'above' if separated else 'not above'} the baseline's highest), "
            f"simulated {simulated} (best baseline {best_sim.policy}).")


def _live_ratio(toggle: PolicyRepeats, baselines: Sequence[PolicyRepeats],
                metric: str) -> tuple[PolicyRepeats, str]:
    """The baseline with the highest live mean of ``metric``, and the toggle's mean over it."""
    best = max(baselines, key=lambda p: p.real()[metric].mean)
    return best, _ratio(toggle.real()[metric].mean, best.real()[metric].mean)


def _sim_ratio(toggle: PolicyRepeats, baselines: Sequence[PolicyRepeats],
               metric: str) -> tuple[PolicyRepeats, str]:
    """The baseline whose twins give the highest ``metric``, and the toggle's twins over it."""
    best = max(baselines, key=lambda p: p.sim()[metric])
    return best, _ratio(toggle.sim()[metric], best.sim()[metric])


def rounds_lines(policies: Sequence[PolicyRepeats]) -> list[str]:
    """The toggle's ratio in each round of the study. A round runs every policy once, one after
    another, so a slow spell on the shared machine lands on a whole round: set beside the host's
    speed in that round (the median over its runs), the ratios tell a win that a slow spell
    hid from one that is not there. Nothing with a single round or without the toggle."""
    rounds = min(len(p.runs) for p in policies)
    if rounds < 2 or _contenders(policies) is None:
        return []
    parts = [_round_part(k, [PolicyRepeats(p.policy, (p.runs[k],)) for p in policies]) for k in range(rounds)]
    return [f"{TOGGLE} goodput / best baseline's by round (each round runs every policy once): "
            + "; ".join(parts) + "."]


def _round_part(k: int, runs: Sequence[PolicyRepeats]) -> str:
    contenders = _contenders(runs)
    assert contenders is not None, "rounds_lines asks only when the toggle and a baseline ran"
    toggle, baselines = contenders
    speeds = [r for r in (p.profile_ratio().mean for p in runs) if not math.isnan(r)]
    speed = statistics.median(speeds) if speeds else math.nan
    best, live = _live_ratio(toggle, baselines, GOODPUT)
    _, stream = _live_ratio(toggle, baselines, STREAM_GOODPUT)
    best_sim, simulated = _sim_ratio(toggle, baselines, GOODPUT)
    return (f"round {k + 1}, host at {_times(speed)} the profile: live {live} over {best.policy} "
            f"(stream {stream}), twin {simulated} over {best_sim.policy}")


def spread_line(policies: Sequence[PolicyRepeats]) -> str:
    """How far apart the repeats' P90 TTFT landed, (max - min) / mean per policy (the slice is
    large enough when this stays under 10%), beside how far the twin's P90 TTFT moves when its
    speed alone changes by ``DRIFT``: a wide live spread that the twin also shows comes from the
    setting (a queue that a little speed moves a lot), not from too few requests."""
    widths = ", ".join(f"{p.policy} {_share(p.real()['ttft_p90_s'].relative_width)} "
                       f"(twin: {_share(p.drift_width())})" for p in policies)
    drift = "/".join(f"{f:g}" for f in DRIFT)
    return (f"Repeat spread of P90 TTFT, (max - min) / mean, and in parentheses the twin's spread "
            f"with its speed times {drift}: {widths}.")


def hit_rate_line(policies: Sequence[PolicyRepeats]) -> str:
    """The server's prefix-cache hit rate (its ``cached_tokens`` over prompt tokens) beside the
    twin's prediction, per policy, and the difference in percentage points."""
    parts = []
    for p in policies:
        live, twin = p.hit_rates()
        gap = "-" if math.isnan(live.mean) else f"{(twin - live.mean) * 100:+.1f} pp"
        parts.append(f"{p.policy} {_share(live.mean)} ({_share(live.low)}..{_share(live.high)}) / "
                     f"{_share(twin)} ({gap})")
    return ("Prefix cache hits, share of prompt tokens, live (the server's cached_tokens) / twin: "
            + "; ".join(parts) + ".")


def speed_line(policies: Sequence[PolicyRepeats]) -> str:
    """How fast the host ran against the profile, from every run's iteration log: a study whose
    runs were far from it loaded its host otherwise than the profile's host (docs/fidelity.md)."""
    ratios = {p.policy: p.profile_ratio() for p in policies}
    each = ", ".join(f"{policy} {_times(r.mean)} ({_times(r.low)}..{_times(r.high)})"
                     for policy, r in ratios.items())
    beyond = [policy for policy, r in ratios.items() if far(r.high) or far(r.low)]
    verdict = (f"outside 1/{TOLERANCE:g}..{TOLERANCE:g}x for {', '.join(beyond)}: the load is not that of "
               "the profile's host" if beyond else f"all within 1/{TOLERANCE:g}..{TOLERANCE:g}x")
    return f"Live iterations' compute over the profile's prediction for them: {each}; {verdict}."


def _times(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}x"


def report(policies: Sequence[PolicyRepeats], host: dict[str, Any] | None = None) -> str:
    """The report; ``host`` is the study's host check (``fidelity.host``), when it made one."""
    repeats = min(len(p.runs) for p in policies)
    numbers = sum(1 for p in policies for m in METRICS if not math.isnan(p.errors()[m]))
    paths = merge([p.paths() for p in policies])
    return "\n".join([
        *host_lines(host),
        f"Each cell: real mean (min..max over {repeats} repeat{'s' if repeats > 1 else ''}) / simulated "
        "(mean of the repeats' twins) relative error, ✓ when the simulated value lies within min..max. "
        "Times in ms.", "",
        numbers_table(policies), "",
        f"Median absolute error over the {numbers} latency and attainment numbers: "
        f"{_share(median_abs_error(policies))}; within 20%: {_within(policies, 0.2)} of {numbers}.", "",
        "Between tokens (per-token ITL from each stream's chunks, the share of requests with a gap "
        "over 1 s between two chunks, and stream attainment: the SLOs met and no gap over the TBT "
        "SLO), reported beside the numbers above and not in their error:", "",
        numbers_table(policies, (*STREAM_METRICS, STREAM_GOODPUT)), "",
        spread_line(policies), speed_line(policies), "", hit_rate_line(policies), "",
        f"Path agreement: {paths.same} of {paths.compared} requests ({_share(path_agreement(policies))}) "
        "took the same path live and in the twin.", "",
        paths_table(policies), "",
        *ranking_lines(policies), toggle_line(policies), *rounds_lines(policies)])


def host_lines(host: dict[str, Any] | None) -> list[str]:
    """What the host check measured before the first run, and whether the load was matched."""
    if host is None:
        return []
    r, kinds = host["ratio"], per_kind(host["by_kind"])
    line = f"Host check: this host ran the engine at {r:.2f}x the profile's times ({kinds}); "
    if host["matched"]:
        asked = host["asked"]
        line += (f"the load was matched to it: rate scale {asked['rate_scale']:g} x {1 / r:.2f}, SLOs "
                 f"{asked['slo_ttft_ms']:g} / {asked['slo_tpot_ms']:g} ms and the profile's times x {r:.2f}.")
    else:
        line += "the load was not matched to it."
    return [line, ""]


def _within(policies: Sequence[PolicyRepeats], bound: float) -> int:
    return sum(1 for p in policies for m in METRICS if abs(p.errors()[m]) <= bound)


def _share(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.1%}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"
