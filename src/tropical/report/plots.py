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
         "tropical": ("tab:orange", "-"), "tropical+": ("tab:red", "-")}


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


def write_all(rep: Reproduction, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [attainment_vs_rate(rep, out / "attainment_vs_rate.png"),
            latency_cdfs(rep, out / "latency_cdfs.png"),
            queueing_cdf(rep, out / "queueing.png")]


def _completed(run: SimResult) -> list:
    return [r for r in run.requests if r.error is None and r.finish is not None]
