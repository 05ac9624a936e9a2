"""A latency model corrected online: a profile, scaled by what observed iterations took.

Predictions drift from a profile when the hardware, the load or the serving stack differ from
where it was measured. Each observed stretch is reported against the profile's prediction, and a
moving average of the ratios scales the prefill and decode parts of every later prediction (the
decode part stays a line in the context, as the simulator needs). The toggle's workers observe
their own iterations (``observe``); a vLLM instance, which plans its own iterations, is observed
through its streams (a prompt's first token ends a prefill, ``observe``; tokens between events
end runs of decodes, ``observe_decodes``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape

SMOOTHING = 0.2
"""Weight of each new observation: about the last ten dominate, so one stall does not swing it."""
BOUNDS = (0.2, 5.0)
"""Ratios outside these are measurement accidents (a stall, a clock jump), not the instance."""


@dataclass(slots=True)
class OnlineLatency(LatencyModel):
    """``base`` with its prefill part scaled by ``prefill_scale`` and its decode part by
    ``decode_scale``; ``observe_*`` move the scales toward observed/predicted."""

    base: LatencyModel
    prefill_scale: float = 1.0
    decode_scale: float = 1.0
    observations: int = 0

    def iteration_time(self, shape: BatchShape) -> float:
        decodes = BatchShape.decode(shape.decode_count, shape.decode_context)
        decode = self.base.iteration_time(decodes) if shape.decode_count else 0.0
        prefill = self.base.iteration_time(shape) - decode if shape.num_prefills else 0.0
        return prefill * self.prefill_scale + decode * self.decode_scale

    def decode_line(self, batch: int) -> tuple[float, float]:
        intercept, slope = self.base.decode_line(batch)
        return intercept * self.decode_scale, slope * self.decode_scale

    def transfer_time(self, tokens: int) -> float:
        return self.base.transfer_time(tokens)

    @property
    def monotone(self) -> bool:
        """The prefill part (the base's time less its decodes') and the decode part each grow
        with the batch under a monotone base, and the scales are positive."""
        return self.base.monotone

    def observe(self, shape: BatchShape, seconds: float, times: int = 1) -> None:
        """An iteration over ``shape`` took ``seconds`` (``times`` alike ones did: a run of
        decode iterations). A mixed one's decode part, priced as now corrected, is taken off
        before its prefill part is learned."""
        decodes = BatchShape.decode(shape.decode_count, shape.decode_context)
        decode = self.base.iteration_time(decodes) if shape.decode_count else 0.0
        if not shape.num_prefills:
            if decode > 0:
                self.decode_scale = self._blend(self.decode_scale, seconds / decode, times)
            return
        prefill = self.base.iteration_time(shape) - decode
        if prefill > 0:
            self.prefill_scale = self._blend(self.prefill_scale,
                                             (seconds - decode * self.decode_scale) / prefill, times)

    def observe_decodes(self, batch: int, context: int, steps: int, seconds: float) -> None:
        """``steps`` decode-only iterations of ``batch`` requests (``context`` tokens in all)."""
        predicted = self.base.iteration_time(BatchShape.decode(batch, context)) * steps
        if predicted > 0:
            self.decode_scale = self._blend(self.decode_scale, seconds / predicted)

    def _blend(self, scale: float, ratio: float, times: int = 1) -> float:
        """Move ``scale`` toward ``ratio`` as ``times`` observations of it would."""
        low, high = BOUNDS
        if not low <= ratio <= high:
            return scale
        self.observations += times
        weight = 1 - (1 - SMOOTHING) ** times
        return (1 - weight) * scale + weight * ratio
