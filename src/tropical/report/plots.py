"""PNG figures of a reproduction: attainment against rate, latency CDFs, queueing."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from tropical.core.metrics import queueing, tpot, ttft
from tropical.report.figures import cdf, save
from tropical.sim.reproduce import Reproduction
from tropical.sim.run import SimResult

STYLE = {"colocated": ("tab:gray", "--"), "chunked": ("tab:brown", "--"),
         "chunked-512": ("tab:olive", "--"), "chunked-1024": ("tab:green", "--"),
         "chunked-2048": ("tab:brown", "--"), "disagg": ("tab:blue", "--"),
         "disagg-1p": ("tab:cyan", "--"), "disagg-3p": ("tab:purple", "--"),
         "tropical": ("tab:orange", "-"), "tropical+": ("tab:red", "-"),
         "kv-router": ("tab:pink", ":"), "kv-router-1024": ("magenta", ":"),
         "kv-router-2048": ("darkviolet", ":"), "kv-router-disagg": ("navy", ":")}


def _style(policy: str) -> dict:
    color, line = STYLE.get(policy, ("black", "-"))
    return {"color": color, "linestyle": line, "label": policy}


def attainment_vs_rate(rep: Reproduction, path: Path) -> Path:
    """Both attainments against rate, with the work bound and the pooled bound marked."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for column, (ax, title) in enumerate(zip(axes, ("SLO attainment (mean TPOT)",
                                                    "stream attainment (every gap ≤ TBT SLO)"),
                                             strict=True)):
        for policy, points in rep.curve.items():
            rates = [p[0] for p in points]
            ax.plot(rates, [p[1 + column] for p in points], marker="o", **_style(policy))
        ax.axhline(0.9, color="black", linewidth=0.8, linestyle=":")
        ax.axvline(rep.bound.rate_rps, color="black", linewidth=0.8, linestyle="-.", label="work bound")
        ax.axvline(rep.pooled_rps, color="grey", linewidth=0.8, linestyle="--", label="pooled bound")
        ax.set(xlabel="request rate (req/s)", ylim=(0, 1.02), title=title)
    axes[0].set(ylabel="fraction of requests")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{rep.base.trace.name}, {rep.base.cluster.name} cluster")
    return save(fig, path)


def latency_cdfs(rep: Reproduction, path: Path) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for policy, at in rep.at_common.items():
        done = _completed(at.result)
        cdf(left, [ttft(r) for r in done], **_style(policy))
        cdf(right, [tpot(r) for r in done], **_style(policy))
    rate = rep.common_scale * rep.base.trace.mean_rate
    left.set(xscale="log", xlabel="TTFT (s)", ylabel="fraction of requests",
             title=f"TTFT at {rate:.2f} req/s")
    right.set(xscale="log", xlabel="TPOT (s)", title=f"TPOT at {rate:.2f} req/s")
    left.legend()
    return save(fig, path)


def queueing_cdf(rep: Reproduction, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for policy, at in rep.at_common.items():
        cdf(ax, [max(queueing(r), 1e-4) for r in _completed(at.result)], **_style(policy))
    ax.set(xscale="log", xlabel="queueing before prefill starts (s)", ylabel="fraction of requests",
           title="Queueing delay at the common rate")
    ax.legend()
    return save(fig, path)


def capacities(rep: Reproduction, path: Path) -> Path:
    """Each policy's capacity under both attainments, with the prefix cache and without it (the
    paper's setting), beside each setting's work bound."""
    settings = [("prefix cache on" if rep.base.prefix_cache else "no prefix cache",
                 {p: (c.capacity_rps, c.stream_capacity_rps) for p, c in rep.capacity.items()},
                 rep.bound.rate_rps)]
    if rep.paper is not None:
        (variant, plain), = rep.paper.capacity.items()
        settings.append(("no prefix cache (the paper's setting)",
                         {p: (c, rep.paper.stream[variant][p]) for p, c in plain.items()},
                         rep.paper.bound[variant]))
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4.5), sharey=True, squeeze=False)
    for ax, (title, caps, bound) in zip(axes[0], settings, strict=True):
        names = list(caps)
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], [caps[p][0] for p in names], 0.4, label="paper's metric",
               color=[_style(p)["color"] for p in names])
        ax.bar([i + 0.2 for i in x], [caps[p][1] for p in names], 0.4, label="stream attainment",
               color=[_style(p)["color"] for p in names], alpha=0.5)
        ax.axhline(bound, color="black", linewidth=0.8, linestyle="-.", label="work bound")
        ax.set_xticks(list(x), names, rotation=60, ha="right", fontsize=7)
        ax.set(title=title, ylabel="goodput capacity (req/s)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{rep.base.trace.name}, {rep.base.cluster.name} cluster")
    return save(fig, path)


def overload(rep: Reproduction, path: Path) -> Path:
    """Goodput against offered rate past the work bound, one panel per admission mode, with the
    attainment curves' runs (no admission) below it."""
    past = rep.overload
    assert past is not None
    modes = list(next(iter(past.points.values())))
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 4), sharey=True)
    for ax, mode in zip(axes, modes, strict=True):
        for policy, by_mode in past.points.items():
            runs = sorted(by_mode[mode].items())
            below = [(rate, att * rate) for rate, att, _ in rep.curve.get(policy, [])
                     if rate < past.bound_rps]
            rates = [r for r, _ in below] + [m * past.bound_rps for m, _ in runs]
            ax.plot(rates, [g for _, g in below] + [p.goodput_rps for _, p in runs], marker="o",
                    **_style(policy))
        ax.axvline(past.bound_rps, color="black", linewidth=0.8, linestyle="-.", label="work bound")
        ax.axhline(past.bound_rps, color="black", linewidth=0.8, linestyle=":")
        ax.set(xlabel="offered rate (req/s)", title=f"admission: {mode}")
    axes[0].set(ylabel="goodput (requests within SLO per s)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Goodput past capacity (points below the bound: attainment x rate, no admission)")
    return save(fig, path)


def write_all(rep: Reproduction, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [attainment_vs_rate(rep, out / "attainment_vs_rate.png"),
            capacities(rep, out / "capacities.png"),
            latency_cdfs(rep, out / "latency_cdfs.png"),
            queueing_cdf(rep, out / "queueing.png"),
            *([overload(rep, out / "overload.png")] if rep.overload is not None else [])]


def _completed(run: SimResult) -> list:
    return [r for r in run.requests if r.error is None and r.finish is not None]
