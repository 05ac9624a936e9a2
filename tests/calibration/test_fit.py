"""The fitter recovers factors it generated data from."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tropical.calibration import predict
from tropical.calibration.fit import START, fit_gemm, nelder_mead
from tropical.calibration.vidur import GpuProfiles, OpProfile
from tropical.core.latency.roofline import OpEfficiency, Shard
from tropical.core.specs import A100_80GB, ModelSpec


def test_nelder_mead_finds_a_quadratic_minimum() -> None:
    best = nelder_mead(lambda x: float(np.sum((x - np.array([1.0, -2.0])) ** 2)), [0.0, 0.0])
    assert best == pytest.approx([1.0, -2.0], abs=1e-3)


def test_gemm_factors_are_recovered_from_synthetic_rows() -> None:
    truth = replace(START, gemm=OpEfficiency(0.65, 0.9, 8e-6, 1.8))
    spec = ModelSpec("toy", 1, 4096, 32, 8, 128, 14336, 32000, 4096)
    tokens = np.array([1, 8, 32, 128, 256, 512, 1024, 2048, 4096, 8192], dtype=float)
    ops = []
    for tp in (1, 2, 4):
        blank = OpProfile("toy", tp, Shard.of(spec, tp), tokens, {})
        seconds = {op: predict.gemm(truth, A100_80GB, blank, op) for op in predict.GEMM_OPS}
        ops.append(replace(blank, seconds=seconds))
    fitted = fit_gemm(START, GpuProfiles(A100_80GB, ops=ops)).gemm
    assert fitted.compute == pytest.approx(0.65, rel=0.02)
    assert fitted.memory == pytest.approx(0.9, rel=0.02)
    assert fitted.overhead == pytest.approx(8e-6, rel=0.1)
