"""Figure helpers shared by every plot we write: headless backend, CDF lines, saving."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def cdf(ax: plt.Axes, values: Sequence[float], **style: Any) -> None:
    """The empirical CDF of ``values`` (nothing drawn when empty)."""
    data = np.sort(np.asarray(values, dtype=float))
    if len(data):
        ax.plot(data, np.arange(1, len(data) + 1) / len(data), **style)


def save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
