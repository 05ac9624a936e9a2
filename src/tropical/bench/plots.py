"""PNG figures of a bench run: latency CDFs against the SLOs, attainment over the run."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from tropical.bench.run import BenchRun
from tropical.core.metrics import STALL_S, attains, tpot, ttft
from tropical.report.figures import cdf, save

MAX_WINDOWS = 20


def latency_cdfs(run: BenchRun, path: Path) -> Path:
    """TTFT, TPOT and per-token ITL of completed requests against their SLOs; inter-chunk gaps
    (what a reader of the stream waits) against the 1 s stall line."""
    done = [r for r in run.requests if r.error is None]
    streams = [m for m in run.measurements if m.error is None]
    slo = run.config.slo
    panels = (("TTFT", [ttft(r) for r in done], slo.ttft, "SLO"),
              ("TPOT", [tpot(r) for r in done], slo.tpot, "SLO"),
              ("per-token ITL", [v for m in streams for v in m.itls()], slo.tpot, "TPOT SLO"),
              ("inter-chunk gap", [g for m in streams for g in m.chunk_gaps()], STALL_S, "stall"))
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for ax, (name, values, target, line) in zip(axes, panels, strict=True):
        cdf(ax, values, color="tab:orange", label=run.model.id)
        ax.axvline(target, color="black", linewidth=0.8, linestyle=":", label=f"{line} {target * 1e3:g} ms")
        ax.set(xlabel=f"{name} (s)", ylabel="fraction", title=f"{name} at {run.rate_rps:.2f} req/s")
    axes[0].legend()
    return save(fig, path)


def attainment_over_time(run: BenchRun, path: Path) -> Path:
    """Attainment of the requests sent in each window: shows when the server fell behind."""
    sent = np.array([r.arrival for r in run.requests])
    ok = np.array([attains(r) for r in run.requests], dtype=float)
    edges = np.linspace(0.0, max(sent.max(), 1e-9), min(MAX_WINDOWS, len(sent)) + 1)
    window = np.clip(np.digitize(sent, edges) - 1, 0, len(edges) - 2)
    filled = [w for w in range(len(edges) - 1) if (window == w).any()]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot([(edges[w] + edges[w + 1]) / 2 for w in filled], [ok[window == w].mean() for w in filled],
            marker="o", color="tab:orange", label="requests sent in the window")
    ax.axhline(run.summary.core.attainment, color="tab:gray", linestyle="--", label="whole run")
    ax.set(xlabel="send time (s)", ylabel="SLO attainment", ylim=(0, 1.02),
           title=f"SLO attainment over the run ({run.config.trace})")
    ax.legend()
    return save(fig, path)


def write_plots(run: BenchRun, out: Path) -> list[Path]:
    return [latency_cdfs(run, out / "latency_cdfs.png"),
            attainment_over_time(run, out / "attainment_over_time.png")]
