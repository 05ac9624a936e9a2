"""Loading the shipped calibration files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tropical.calibration.store import load_efficiency, load_roofline
from tropical.core.latency.shape import BatchShape
from tropical.core.specs import A100_80GB, H100_80GB, HardwareSpec, ModelSpec, ReplicaSpec

SPEC = ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096)


@pytest.mark.parametrize("gpu", [A100_80GB, H100_80GB])
def test_shipped_gpus_load(gpu: HardwareSpec) -> None:
    model = load_roofline(ReplicaSpec(SPEC, gpu, tp=1))
    assert 0 < model.iteration_time(BatchShape.prefill(1024)) < 1.0


def test_h100_is_faster_than_a100() -> None:
    shape = BatchShape.prefill(4096)
    a100 = load_roofline(ReplicaSpec(SPEC, A100_80GB)).iteration_time(shape)
    assert load_roofline(ReplicaSpec(SPEC, H100_80GB)).iteration_time(shape) < a100


def test_unknown_gpu_names_the_calibrated_ones() -> None:
    b200 = HardwareSpec("b200", 2.25e15, 192 * 2**30, 8e12, 900e9, 63e9)
    with pytest.raises(ValueError, match=r"'b200'.*a100-80gb, h100-80gb"):
        load_roofline(ReplicaSpec(SPEC, b200))


@pytest.mark.parametrize("content", ["{not json", json.dumps({"gpu": "x"}),
                                     json.dumps({"efficiency": {"gemm": {"speed": 1}}})])
def test_broken_file_is_a_clear_error(tmp_path: Path, content: str) -> None:
    (tmp_path / "a100-80gb.json").write_text(content)
    with pytest.raises(ValueError, match="not a valid calibration file"):
        load_efficiency("a100-80gb", tmp_path)
