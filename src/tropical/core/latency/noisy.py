"""A predictor that is wrong on purpose: the true model times a bounded, repeatable error.

Used to measure how much a policy's gains depend on exact predictions. The error of each
prediction is a deterministic function of the question asked (the batch shape, the batch size,
the token count) and the seed, uniform in [-noise, +noise], so runs stay reproducible (keys are
made of integers only: a string's hash is salted per process, so a key holding one gave every
process its own errors); ``bias``
adds the same relative error to every prediction (a profile measured on a faster machine).
"""

from __future__ import annotations

from dataclasses import dataclass

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape

_GOLDEN = 0x9E3779B1
_DECODE, _TRANSFER = 1, 2
"""Tags that keep decode-line and transfer questions apart from each other in the error's key."""


@dataclass(frozen=True, slots=True)
class NoisyModel(LatencyModel):
    """``truth``'s predictions, each scaled by (1 + bias)(1 + e), e uniform in [-noise, +noise]."""

    truth: LatencyModel
    noise: float
    seed: int = 0
    bias: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.noise < 1:
            raise ValueError(f"predictor noise must lie in [0, 1), got {self.noise}")
        if not -1 < self.bias < 1:
            raise ValueError(f"predictor bias must lie in (-1, 1), got {self.bias}")

    def _factor(self, key: object) -> float:
        unit = ((hash(key) ^ self.seed) * _GOLDEN % 2**32) / 2**32
        return (1.0 + self.bias) * (1.0 + self.noise * (2.0 * unit - 1.0))

    def iteration_time(self, shape: BatchShape) -> float:
        return self.truth.iteration_time(shape) * self._factor(shape)

    def decode_line(self, batch: int) -> tuple[float, float]:
        intercept, slope = self.truth.decode_line(batch)
        factor = self._factor((_DECODE, batch))
        return intercept * factor, slope * factor

    def transfer_time(self, tokens: int) -> float:
        return self.truth.transfer_time(tokens) * self._factor((_TRANSFER, tokens))

    @property
    def monotone(self) -> bool:
        """A bias scales every prediction alike; an error drawn per question does not."""
        return self.noise == 0 and self.truth.monotone
