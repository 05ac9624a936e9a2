"""A latency model fitted to measurements, DistServe-style, loaded from a documented dict.

prefill(spans)   = a_p + b_p * Σnew + c_p * Σpairs·2   (Σlen² for prefills without cache)
decode(B, ΣC)    = a_d + b_d * ΣC + c_d * B
mixed iteration  = prefill part + b_d * ΣC + c_d * B   (decodes ride on the prefill's pass)
transfer(tokens) = t_0 + tokens * kv_bytes_per_token / bandwidth

The engine's profiler writes this file; the JSON layout is documented in ``FittedModel.to_dict``;
``fit_error`` (the profiler's report of how well the fit matched its measurements) is read past.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape

FORMAT = "tropical-latency-profile/1"
REPORT_KEYS = ("fit_error",)
COMPUTE = ("prefill_intercept", "prefill_per_token", "prefill_per_pair", "decode_intercept",
           "decode_per_context", "decode_per_seq")


@dataclass(frozen=True, slots=True)
class FittedModel(LatencyModel):
    """Seconds as linear functions of a batch's aggregate sums."""

    prefill_intercept: float
    prefill_per_token: float
    prefill_per_pair: float
    decode_intercept: float
    decode_per_context: float
    decode_per_seq: float
    kv_bytes_per_token: float
    transfer_bandwidth: float
    transfer_latency: float = 0.0

    def __post_init__(self) -> None:
        if self.transfer_bandwidth <= 0:
            raise ValueError("latency profile: transfer_bandwidth must be positive")
        for name, value in asdict(self).items():
            if value < 0:
                raise ValueError(f"latency profile: {name} must not be negative, got {value}")

    def iteration_time(self, shape: BatchShape) -> float:
        decode = self.decode_per_context * shape.decode_context + self.decode_per_seq * shape.decode_count
        if shape.num_prefills == 0:
            return self.decode_intercept + decode if shape.decode_count else 0.0
        prefill = (self.prefill_intercept + self.prefill_per_token * shape.prefill_tokens
                   + self.prefill_per_pair * 2 * shape.prefill_pairs)
        return prefill + decode

    def decode_line(self, batch: int) -> tuple[float, float]:
        return self.decode_intercept + self.decode_per_seq * batch, self.decode_per_context

    @property
    def monotone(self) -> bool:
        """Its rates are nonnegative; but a mixed batch drops the decode intercept for the
        prefill one, so a decode batch given a one-token prompt must not get faster."""
        return (self.prefill_intercept + self.prefill_per_token + 2 * self.prefill_per_pair
                >= self.decode_intercept)

    def transfer_time(self, tokens: int) -> float:
        return self.transfer_latency + tokens * self.kv_bytes_per_token / self.transfer_bandwidth

    def slowed(self, factor: float) -> FittedModel:
        """This model with every compute time ``factor`` times longer (a host that slow); KV
        transfers keep their speed, which the link sets."""
        if factor <= 0:
            raise ValueError(f"latency profile: slow-down factor must be positive, got {factor}")
        return replace(self, **{name: getattr(self, name) * factor for name in COMPUTE})

    def to_dict(self) -> dict[str, Any]:
        """The profile file's content: ``format`` plus every coefficient in seconds and bytes."""
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FittedModel:
        if data.get("format") != FORMAT:
            raise ValueError(f"latency profile: expected format {FORMAT!r}, got {data.get('format')!r}")
        fields = {k: v for k, v in data.items() if k != "format" and k not in REPORT_KEYS}
        try:
            return cls(**{k: float(v) for k, v in fields.items()})
        except TypeError as err:
            raise ValueError(f"latency profile: {err}") from None
