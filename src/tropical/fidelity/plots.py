"""Figures of a fidelity study: real against simulated per policy, and the real latency CDFs."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from tropical.bench.run import BenchRun
from tropical.core.metrics import tpot, ttft
from tropical.fidelity.compare import Comparison, values
from tropical.report.figures import cdf, save

PANELS = (("attainment", "SLO attainment", 1.0), ("ttft_p90_s", "P90 TTFT (s)", 1.0),
          ("tpot_p90_s", "P90 TPOT (ms)", 1e3))


def real_vs_sim(results: list[Comparison], path: Path) -> Path:
    """Side-by-side bars per policy: the live server, and the simulator on the same requests."""
    x = np.arange(len(results))
    sides = ((-0.2, "real", [values(r.real) for r in results], "tab:orange"),
             (0.2, "simulated", [values(r.adjusted) for r in results], "tab:blue"))
    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4))
    for ax, (metric, label, unit) in zip(axes, PANELS, strict=True):
        for offset, name, rows, color in sides:
            ax.bar(x + offset, [row[metric] * unit for row in rows], 0.4, label=name, color=color)
        ax.set_xticks(x, [r.policy for r in results])
        ax.set(ylabel=label, title=label)
    axes[0].legend()
    return save(fig, path)


def real_cdfs(runs: list[BenchRun], policies: list[str], path: Path) -> Path:
    """TTFT and TPOT of completed requests on the live server, one line per policy."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for run, policy in zip(runs, policies, strict=True):
        done = [r for r in run.requests if r.error is None]
        cdf(axes[0], [ttft(r) for r in done], label=policy)
        cdf(axes[1], [tpot(r) for r in done], label=policy)
    slo = runs[0].config.slo
    for ax, name, target in ((axes[0], "TTFT", slo.ttft), (axes[1], "TPOT", slo.tpot)):
        ax.axvline(target, color="black", linewidth=0.8, linestyle=":", label=f"SLO {target * 1e3:g} ms")
        ax.set(xlabel=f"{name} (s)", ylabel="fraction", title=f"{name} on the live server")
    axes[0].legend()
    return save(fig, path)
