"""Calibration against Vidur's profiles: error bounds of the shipped factors, reproducibility."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tropical.calibration.command import calibrate_main
from tropical.calibration.predict import GEMM_OPS
from tropical.calibration.report import OpError, op_errors
from tropical.calibration.store import CALIBRATION_DIR, load_efficiency
from tropical.calibration.vidur import GpuProfiles, load_profiles

VIDUR = Path(__file__).parents[2].parent / "shared" / "data" / "profiles" / "vidur"
GPUS = ("a100-80gb", "h100-80gb")


@pytest.fixture(scope="module")
def profiles() -> dict[str, GpuProfiles]:
    return load_profiles(VIDUR)


@pytest.fixture(scope="module")
def errors(profiles: dict[str, GpuProfiles]) -> dict[str, list[OpError]]:
    return {gpu: op_errors(load_efficiency(gpu), profiles[gpu]) for gpu in GPUS}


def test_profiles_cover_both_gpus(profiles: dict[str, GpuProfiles]) -> None:
    assert set(GPUS) <= set(profiles)
    assert {p.model for p in profiles["a100-80gb"].ops} == {
        "internlm-20b", "Llama-2-7b-hf", "Meta-Llama-3-8B"}
    assert {p.tp for p in profiles["h100-80gb"].ops} == {1, 2, 4, 8}
    assert profiles["a100-80gb"].attention and not profiles["h100-80gb"].attention


@pytest.mark.parametrize("gpu", GPUS)
def test_gemm_median_error_within_ten_percent(errors: dict[str, list[OpError]], gpu: str) -> None:
    gemm = [e for e in errors[gpu] if e.op in GEMM_OPS]
    assert len(gemm) == 4 * (3 if gpu == "a100-80gb" else 2)
    assert all(e.median_ape <= 0.10 for e in gemm), [e for e in gemm if e.median_ape > 0.10]


@pytest.mark.parametrize("gpu", GPUS)
def test_other_ops_stay_near_their_calibrated_error(errors: dict[str, list[OpError]],
                                                   gpu: str) -> None:
    """Guards against regressions; elementwise ops last only microseconds, hence 16%."""
    bounds = {"attn_decode": 0.12, "all_reduce": 0.12, "send_recv": 0.08}
    for e in errors[gpu]:
        assert e.median_ape <= bounds.get(e.op, 0.16) or e.op == "attn_prefill", e


def test_prefill_attention_fits_its_causal_backend(errors: dict[str, list[OpError]]) -> None:
    prefill = {e.subject: e.median_ape for e in errors["a100-80gb"] if e.op == "attn_prefill"}
    assert prefill["Meta-Llama-3-8B tp1 flashinfer"] <= 0.05


def test_shipped_files_are_what_calibrate_writes(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    documents = calibrate_main(VIDUR, tmp_path, report=True)
    assert set(documents) == set(GPUS)
    for gpu in GPUS:
        shipped = json.loads((CALIBRATION_DIR / f"{gpu}.json").read_text())
        written = json.loads((tmp_path / f"{gpu}.json").read_text())
        assert written == shipped == documents[gpu]
    table = capsys.readouterr().out
    assert "attn_pre_proj" in table and "h100-80gb" in table


def test_missing_profiles_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no Vidur profiles"):
        load_profiles(tmp_path)
