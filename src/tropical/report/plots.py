"""PNG figures of a reproduction: attainment against rate, latency CDFs, queueing."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from tropical.core.metrics import queueing, tpot, ttft
from tropical.report.figures import cdf, save
from tropical.sim.reproduce import Reproduction
from tropical.sim.run import SimResult

STYLE = {"colocated": ("tab:gray", "--"), "chunked": ("tab:brown", "--"), "disagg": ("tab:blue", "--"),
         "tropical": ("tab:orange", "-"), "tropical+": ("tab:red", "-")}


def _style(policy: str) -> dict:
    color, line = STYLE.get(policy, ("black", "-"))
    return {"color": color, "linestyle": line, "label": policy}


def attainment_vs_rate(rep: Reproduction, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for policy, points in rep.curve.items():
        rates, attained = zip(*points, strict=True)
        ax.plot(rates, attained, marker="o", **_style(policy))
    ax.axhline(0.9, color="black", linewidth=0.8, linestyle=":")
    ax.set(xlabel="request rate (req/s)", ylabel="SLO attainment", ylim=(0, 1.02),
           title=f"SLO attainment vs rate ({rep.base.trace.name}, {rep.base.cluster.name} cluster)")
    ax.legend()
    return save(fig, path)


def latency_cdfs(rep: Reproduction, path: Path) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for policy, run in rep.at_common.items():
        done = _completed(run)
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
    for policy, run in rep.at_common.items():
        cdf(ax, [max(queueing(r), 1e-4) for r in _completed(run)], **_style(policy))
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
