"""Per-op errors of a calibrated roofline against the profile rows, and their table."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

from tropical.calibration import predict
from tropical.calibration.vidur import MLP_OPS, GpuProfiles
from tropical.core.latency.roofline import Efficiency


@dataclass(frozen=True)
class OpError:
    """How far the model is from one op's measured rows: median and 90th-percentile APE."""

    gpu: str
    op: str
    subject: str
    rows: int
    median_ape: float
    p90_ape: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _error(gpu: str, op: str, subject: str, predicted: np.ndarray,
           measured: np.ndarray) -> OpError:
    errors = predict.ape(predicted, measured)
    return OpError(gpu, op, subject, len(errors), round(float(np.median(errors)), 4),
                   round(float(np.percentile(errors, 90)), 4))


def op_errors(eff: Efficiency, profiles: GpuProfiles) -> list[OpError]:
    """One row per (op, model or source) measured on this GPU."""
    return list(_mlp_errors(eff, profiles)) + list(_attention_errors(eff, profiles)) + list(
        _link_errors(eff, profiles))


def _mlp_errors(eff: Efficiency, profiles: GpuProfiles) -> Iterator[OpError]:
    gpu, models = profiles.gpu, sorted({p.model for p in profiles.ops})
    for op in MLP_OPS:
        for model in models:
            group = [p for p in profiles.ops if p.model == model]
            predicted = np.concatenate([predict.mlp_op(eff, gpu, p, op) for p in group])
            measured = np.concatenate([p.seconds[op] for p in group])
            yield _error(gpu.name, op, model, predicted, measured)


def _attention_errors(eff: Efficiency, profiles: GpuProfiles) -> Iterator[OpError]:
    gpu = profiles.gpu
    for p in profiles.attention:
        subject = f"{p.source} {p.backend.lower()}"
        if len(p.prefill_seconds):
            yield _error(gpu.name, "attn_prefill", subject, predict.prefill(eff, gpu, p),
                         p.prefill_seconds)
        if len(p.decode_seconds):
            yield _error(gpu.name, "attn_decode", subject, predict.decode(eff, gpu, p),
                         p.decode_seconds)


def _link_errors(eff: Efficiency, profiles: GpuProfiles) -> Iterator[OpError]:
    gpu = profiles.gpu
    for p in profiles.all_reduce:
        yield _error(gpu.name, "all_reduce", f"tp{p.workers}", predict.all_reduce(eff, gpu, p),
                     p.seconds)
    for p in profiles.send_recv:
        yield _error(gpu.name, "send_recv", "intra-node pair", predict.send_recv(eff, gpu, p),
                     p.seconds)


def format_table(errors: list[OpError]) -> str:
    """Plain-text table, one line per op and subject, errors in percent."""
    header = f"{'gpu':<10} {'op':<25} {'model / source':<40} {'rows':>6} {'median':>7} {'p90':>7}"
    lines = [header, "-" * len(header)]
    lines += [f"{e.gpu:<10} {e.op:<25} {e.subject:<40} {e.rows:>6} "
              f"{e.median_ape:>7.1%} {e.p90_ape:>7.1%}" for e in errors]
    return "\n".join(lines)
