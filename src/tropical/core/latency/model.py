"""The predictor interface: every policy and the simulator ask only these questions.

A decode-only iteration must cost ``intercept(batch) + slope * total_context`` exactly, so the
simulator can advance a run of decode iterations in closed form; ``decode_line`` exposes that
line. Implementations: ``RooflineModel`` (calibrated on measured per-op profiles) and
``FittedModel`` (coefficients from the engine's profiler). ``iterations.py`` prices a lone
prefill and a decode batch through it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tropical.core.latency.shape import BatchShape


@runtime_checkable
class LatencyModel(Protocol):
    """Predicts seconds for one iteration on one replica, and for moving KV off it."""

    def iteration_time(self, shape: BatchShape) -> float:
        """Wall time of one forward pass over the batch, sampling included."""
        ...

    def decode_line(self, batch: int) -> tuple[float, float]:
        """(intercept, slope) with decode time = intercept + slope * total context tokens."""
        ...

    def transfer_time(self, tokens: int) -> float:
        """Time to migrate the KV of ``tokens`` tokens to another replica over the link."""
        ...

    @property
    def monotone(self) -> bool:
        """Does an iteration never get faster as its batch grows (a span added, a span given
        more new or cached tokens, a decode added or its context grown), and a prompt of a
        given length never slower for more of it cached? Floors on a prediction built from
        smaller batches (``sched.path2_floors``) hold only then."""
        ...

