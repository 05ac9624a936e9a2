"""A latency model corrected for what a serving stack adds to the engine's own compute.

A profile times forward passes on an idle machine; a live server also pays per-iteration
scheduling and process round trips, and its workers contend for the same cores. Both show up
in the server's own counters, as a compute scale and a constant per-iteration overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape


@dataclass(frozen=True, slots=True)
class AdjustedModel(LatencyModel):
    """``base`` with compute scaled by ``scale`` plus ``overhead`` seconds per iteration and
    ``transfer_scale`` on KV migrations (the decode line stays a line, as the simulator needs)."""

    base: LatencyModel
    scale: float = 1.0
    overhead: float = 0.0
    transfer_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.scale <= 0 or self.overhead < 0 or self.transfer_scale <= 0:
            raise ValueError(f"bad adjustment: scale {self.scale}, overhead {self.overhead}, "
                             f"transfer scale {self.transfer_scale}")

    def iteration_time(self, shape: BatchShape) -> float:
        return self.base.iteration_time(shape) * self.scale + self.overhead

    def decode_line(self, batch: int) -> tuple[float, float]:
        intercept, slope = self.base.decode_line(batch)
        return intercept * self.scale + self.overhead, slope * self.scale

    def transfer_time(self, tokens: int) -> float:
        return self.base.transfer_time(tokens) * self.transfer_scale

    @property
    def monotone(self) -> bool:
        return self.base.monotone
