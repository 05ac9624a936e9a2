"""Fit the roofline's efficiency factors of one GPU to its measured per-op profiles.

Each op class is fitted alone, on its own rows, by minimising the mean absolute log ratio of
predicted to measured time (a relative error that treats over- and under-prediction alike).
Factors are searched in log space with a small Nelder-Mead, so they stay positive; numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from tropical.calibration import predict
from tropical.calibration.vidur import GpuProfiles
from tropical.core.latency.roofline import Efficiency, OpEfficiency

# Not in any profile: vLLM's per-step CPU work (scheduling, input preparation, sampling, Python
# launch gaps) between two forward passes. An assumption, stated in the JSON and the README.
ITERATION_OVERHEAD_S = 2e-3
# Prefill attention rows are compute bound; a near-max blend keeps the memory bound a bound.
PREFILL_SHARPNESS = 4.0
PREFILL_BACKEND = "FLASHINFER"

Pairs = Iterable[tuple[np.ndarray, np.ndarray]]
Predictor = Callable[[Efficiency], Pairs]
Update = Callable[[Efficiency, np.ndarray], Efficiency]

START = Efficiency(
    gemm=OpEfficiency(0.7, 0.8, 5e-6, 2.0), norm=OpEfficiency(memory=0.5, overhead=2e-6),
    rope=OpEfficiency(memory=0.5, overhead=2e-6), activation=OpEfficiency(memory=0.5, overhead=2e-6),
    residual=OpEfficiency(memory=0.5, overhead=2e-6),
    prefill_attention=OpEfficiency(0.5, 0.8, 1.5e-5, PREFILL_SHARPNESS),
    decode_attention=OpEfficiency(memory=0.8, overhead=1.5e-5),
    all_reduce=OpEfficiency(memory=0.5, overhead=2e-5), transfer=OpEfficiency(memory=0.7, overhead=1e-5),
    prefill_tile_waste=300.0, decode_per_sequence=1e-8, iteration_overhead=ITERATION_OVERHEAD_S)


def nelder_mead(f: Callable[[np.ndarray], float], x0: Sequence[float] | np.ndarray, step: float = 0.3,
                max_iter: int = 2000, tol: float = 1e-9) -> np.ndarray:
    """Minimise f from x0 with the classic simplex moves (reflect, expand, contract, shrink)."""
    n = len(x0)
    simplex = np.vstack([np.asarray(x0, float)] + [np.asarray(x0, float) + step * e
                                                   for e in np.eye(n)])
    values = np.array([f(x) for x in simplex])
    for _ in range(max_iter):
        order = np.argsort(values)
        simplex, values = simplex[order], values[order]
        if values[-1] - values[0] < tol:
            break
        centroid = simplex[:-1].mean(axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                values[1:] = [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def log_error(eff: Efficiency, predictor: Predictor) -> float:
    """Mean |log(predicted / measured)| over all rows the predictor yields."""
    pairs = list(predictor(eff))
    predicted = np.concatenate([p for p, _ in pairs])
    measured = np.concatenate([m for _, m in pairs])
    with np.errstate(invalid="ignore", divide="ignore"):
        error = np.abs(np.log(predicted / measured))
    return float(np.mean(error)) if np.all(np.isfinite(error)) else float("inf")


def fit(eff: Efficiency, update: Update, x0: Sequence[float], predictor: Predictor) -> Efficiency:
    """Best factors (positive, searched as logs) for one op class; one restart escapes stalls."""
    def objective(x: np.ndarray) -> float:
        return log_error(update(eff, np.exp(x)), predictor)

    best = nelder_mead(objective, np.log(x0))
    best = nelder_mead(objective, best, step=0.1)
    return update(eff, np.exp(best))


def fit_gemm(eff: Efficiency, profiles: GpuProfiles) -> Efficiency:
    """compute, memory, overhead and sharpness shared by the four weight GEMMs of all models."""
    def update(e: Efficiency, x: np.ndarray) -> Efficiency:
        return replace(e, gemm=OpEfficiency(x[0], x[1], x[2], 1.0 + x[3]))

    def rows(e: Efficiency) -> Pairs:
        return ((predict.gemm(e, profiles.gpu, p, op), p.seconds[op])
                for p in profiles.ops for op in predict.GEMM_OPS)

    g = eff.gemm
    return fit(eff, update, (g.compute, g.memory, g.overhead, g.sharpness - 1.0), rows)


def fit_stream(eff: Efficiency, profiles: GpuProfiles, name: str) -> Efficiency:
    """memory and overhead of one elementwise class, over every column priced by it."""
    columns = [op for op, cls in predict.STREAM_OPS.items() if cls == name]

    def update(e: Efficiency, x: np.ndarray) -> Efficiency:
        changed: dict[str, Any] = {name: OpEfficiency(memory=x[0], overhead=x[1])}
        return replace(e, **changed)

    def rows(e: Efficiency) -> Pairs:
        return ((predict.stream(e, profiles.gpu, p, op), p.seconds[op])
                for p in profiles.ops for op in columns)

    start = getattr(eff, name)
    return fit(eff, update, (start.memory, start.overhead), rows)


def fit_decode(eff: Efficiency, profiles: GpuProfiles) -> Efficiency:
    """Decode attention: KV bandwidth, kernel overhead and a per-sequence cost, all rows."""
    def update(e: Efficiency, x: np.ndarray) -> Efficiency:
        return replace(e, decode_attention=OpEfficiency(memory=x[0], overhead=x[1]),
                       decode_per_sequence=x[2])

    def rows(e: Efficiency) -> Pairs:
        return ((predict.decode(e, profiles.gpu, p), p.decode_seconds)
                for p in profiles.attention if len(p.decode_seconds))

    d = eff.decode_attention
    return fit(eff, update, (d.memory, d.overhead, eff.decode_per_sequence), rows)


def fit_prefill(eff: Efficiency, profiles: GpuProfiles) -> Efficiency:
    """Prefill attention throughput from the causal-skipping backend's rows.

    Only FlashInfer's rows (Llama-3-8B) skip the masked half of causal attention as current
    kernels do; the older FLASH_ATTENTION rows are reported, not fitted. Those rows start at
    1.3k tokens and cannot place the launch overhead, so it and the KV bandwidth are taken from
    decode attention (same kernel family, 10k rows down to tiny sizes).
    """
    def update(e: Efficiency, x: np.ndarray) -> Efficiency:
        d = e.decode_attention
        op = OpEfficiency(x[0], d.memory, d.overhead, PREFILL_SHARPNESS)
        return replace(e, prefill_attention=op, prefill_tile_waste=x[1])

    def rows(e: Efficiency) -> Pairs:
        return ((predict.prefill(e, profiles.gpu, p), p.prefill_seconds)
                for p in profiles.attention
                if p.backend == PREFILL_BACKEND and len(p.prefill_seconds))

    return fit(eff, update, (eff.prefill_attention.compute, eff.prefill_tile_waste), rows)


def fit_links(eff: Efficiency, profiles: GpuProfiles) -> Efficiency:
    """All-reduce (TP rows, ring formula across all TP degrees) and point-to-point copies."""
    def update_reduce(e: Efficiency, x: np.ndarray) -> Efficiency:
        return replace(e, all_reduce=OpEfficiency(memory=x[0], overhead=x[1]))

    def update_copy(e: Efficiency, x: np.ndarray) -> Efficiency:
        return replace(e, transfer=OpEfficiency(memory=x[0], overhead=x[1]))

    def reduce_rows(e: Efficiency) -> Pairs:
        return ((predict.all_reduce(e, profiles.gpu, p), p.seconds) for p in profiles.all_reduce)

    def copy_rows(e: Efficiency) -> Pairs:
        return ((predict.send_recv(e, profiles.gpu, p), p.seconds) for p in profiles.send_recv)

    a, t = eff.all_reduce, eff.transfer
    eff = fit(eff, update_reduce, (a.memory, a.overhead), reduce_rows)
    return fit(eff, update_copy, (t.memory, t.overhead), copy_rows)


def borrow_attention(eff: Efficiency, donor: Efficiency) -> Efficiency:
    """Attention factors (fractions of peak) of another GPU, for GPUs without attention rows."""
    return replace(eff, prefill_attention=donor.prefill_attention,
                   decode_attention=donor.decode_attention,
                   prefill_tile_waste=donor.prefill_tile_waste,
                   decode_per_sequence=donor.decode_per_sequence)


def calibrate(profiles: GpuProfiles, donor: Efficiency | None = None) -> Efficiency:
    """All factors of one GPU; attention comes from ``donor`` when this GPU has no rows."""
    eff = fit_gemm(START, profiles)
    for name in ("norm", "rope", "activation", "residual"):
        eff = fit_stream(eff, profiles, name)
    if profiles.attention:
        eff = fit_prefill(fit_decode(eff, profiles), profiles)
    elif donor is not None:
        eff = borrow_attention(eff, donor)
    else:
        raise ValueError(f"{profiles.gpu.name}: no attention profile and no GPU to borrow from")
    return rounded(fit_links(eff, profiles))


def rounded(eff: Efficiency, digits: int = 4) -> Efficiency:
    """Factors to ``digits`` significant digits, so the shipped JSON reads and diffs cleanly."""
    def r(x: float) -> float:
        return float(f"{x:.{digits}g}")

    def op(o: OpEfficiency) -> OpEfficiency:
        return OpEfficiency(r(o.compute), r(o.memory), r(o.overhead), r(o.sharpness))

    fields: dict[str, Any] = {k: op(getattr(eff, k)) if isinstance(v, dict) else r(v)
                              for k, v in eff.to_dict().items()}
    return replace(eff, **fields)
