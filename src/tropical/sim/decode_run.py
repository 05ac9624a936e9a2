"""A run of consecutive decode-only iterations priced in closed form.

With decode time = a + b·ΣC and every request adding one token of context per iteration, the
k-th iteration of a batch of B costs a + b·(C₀ + k·B). The run's duration is an arithmetic
series, and the iteration boundary at or after any time is a quadratic root: O(1) per run,
whatever its length or batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tropical.core.latency.model import LatencyModel
from tropical.sched.worker import WorkerState


@dataclass(slots=True)
class DecodeRun:
    """``steps`` iterations of a fixed batch of ``batch`` starting at total context ``context``.
    A value: cutting a run builds a new one (not frozen: runs are cut at many events, and a
    frozen one costs several times as much to build; a written constructor, as BatchShape's)."""

    steps: int
    batch: int
    context: int
    intercept: float
    slope: float

    def __init__(self, steps: int, batch: int, context: int, intercept: float, slope: float) -> None:
        self.steps = steps
        self.batch = batch
        self.context = context
        self.intercept = intercept
        self.slope = slope

    @classmethod
    def start(cls, worker: WorkerState, steps: int, latency: LatencyModel) -> DecodeRun:
        intercept, slope = latency.decode_line(worker.batch_size)
        return DecodeRun(steps, worker.batch_size, worker.decode_context, intercept, slope)

    def elapsed(self, k: int) -> float:
        """Time for the first k iterations."""
        first = self.intercept + self.slope * self.context
        return k * first + self.slope * self.batch * k * (k - 1) / 2

    @property
    def duration(self) -> float:
        return self.elapsed(self.steps)

    @property
    def growth(self) -> float:
        """How much longer each iteration is than the one before (the batch's context grows)."""
        return self.slope * self.batch

    def iteration(self, k: int) -> float:
        """Duration of the k-th iteration (from 1)."""
        return self.intercept + self.slope * (self.context + (k - 1) * self.batch)

    def completed_by(self, offset: float) -> int:
        """Iterations finished within ``offset`` of the start, short of the run's last one."""
        boundary = self._first_boundary(offset)
        done = boundary if self.elapsed(boundary) <= offset else boundary - 1
        return min(self.steps - 1, done)

    def cut_to(self, steps: int) -> DecodeRun:
        """The run shortened to at most ``steps`` iterations (at least one)."""
        return DecodeRun(max(1, min(self.steps, steps)), self.batch, self.context, self.intercept,
                         self.slope)

    def cut_at(self, offset: float) -> DecodeRun:
        """The run shortened to the first iteration boundary at or after ``offset`` from start."""
        k = min(self.steps, max(1, self._first_boundary(offset)))
        return DecodeRun(k, self.batch, self.context, self.intercept, self.slope)

    def _first_boundary(self, offset: float) -> int:
        half = self.slope * self.batch / 2
        linear = self.intercept + self.slope * self.context - half
        if half > 0:
            k = math.ceil((-linear + math.sqrt(linear * linear + 4 * half * offset)) / (2 * half))
        else:
            k = math.ceil(offset / linear) if linear > 0 else 1
        while k > 1 and self.elapsed(k - 1) >= offset:
            k -= 1
        while self.elapsed(k) < offset:
            k += 1
        return k
