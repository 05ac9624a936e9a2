"""Two iterations every layer prices through any LatencyModel: a lone prefill, a decode batch.

Apart from the Protocol in model.py so that they compile with the schedulers (mypyc leaves a
Protocol's module interpreted, and the toggle prices a prefill at every decision).
"""

from __future__ import annotations

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape


def prefill_time(model: LatencyModel, new: int, cached: int = 0) -> float:
    """One prefill alone on an idle replica: the light-load TTFT."""
    return model.iteration_time(BatchShape.prefill(new, cached))


def decode_time(model: LatencyModel, batch: int, total_context: int) -> float:
    """One decode-only iteration through the closed-form line."""
    intercept, slope = model.decode_line(batch)
    return intercept + slope * total_context
