"""Figures of a fidelity study: real against simulated per policy, and the real latency CDFs."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from tropical.bench.run import BenchRun
from tropical.core.metrics import tpot, ttft
from tropical.fidelity.repeats import PolicyRepeats
from tropical.report.figures import cdf, save

PANELS = (("attainment", "SLO attainment", 1.0), ("ttft_p90_s", "P90 TTFT (s)", 1.0),
          ("tpot_p90_s", "P90 TPOT (ms)", 1e3))


def real_vs_sim(policies: list[PolicyRepeats], path: Path) -> Path:
    """Side-by-side bars per policy: the live server (mean, whiskers min..max over the repeats),
    and the simulator on the same requests (mean of the repeats' twins)."""
    x = np.arange(len(policies))
    real, sim = [p.real() for p in policies], [p.sim() for p in policies]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4))
    for ax, (metric, label, unit) in zip(axes, PANELS, strict=True):
        means = np.array([r[metric].mean for r in real]) * unit
        whiskers = np.array([[r[metric].mean - r[metric].low, r[metric].high - r[metric].mean]
                             for r in real]).T
        ax.bar(x - 0.2, means, 0.4, yerr=whiskers * unit, capsize=3, label="real", color="tab:orange")
        ax.bar(x + 0.2, [s[metric] * unit for s in sim], 0.4, label="simulated", color="tab:blue")
        ax.set_xticks(x, [p.policy for p in policies])
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
