"""The host check: this host's speed against the study's profile, and the load matched to it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.factories import linear_model
from tropical.core.latency.shape import BatchShape
from tropical.engine.profiler import Sample
from tropical.fidelity import command, options
from tropical.fidelity.host import HostSpeed, matched
from tropical.fidelity.replay import study_profile
from tropical.fidelity.report import host_lines
from tropical.fidelity.run import FidelityConfig


def samples(prefill_slowdown: float, decode_slowdown: float) -> list[Sample]:
    model = linear_model()
    prefill, decode = BatchShape.prefill(100), BatchShape.decode(4, 400)
    return [Sample("prefill", prefill, prefill_slowdown * model.iteration_time(prefill)),
            Sample("decode", decode, decode_slowdown * model.iteration_time(decode))]


def test_host_speed_is_measured_over_predicted_seconds_in_all_and_per_kind() -> None:
    model = linear_model()
    speed = HostSpeed.of(samples(2.0, 3.0), model)
    assert speed.by_kind == pytest.approx({"prefill": 2.0, "decode": 3.0})
    prefill = model.iteration_time(BatchShape.prefill(100))
    decode = model.iteration_time(BatchShape.decode(4, 400))
    assert speed.ratio == pytest.approx((2 * prefill + 3 * decode) / (prefill + decode))
    assert speed.far and "2.00x" in speed.describe()
    assert not HostSpeed.of(samples(1.1, 0.9), model).far
    assert HostSpeed.of(samples(0.5, 0.5), model).far, "a host much faster changes the queues too"
    with pytest.raises(ValueError, match="at least one"):
        HostSpeed.of([], model)


def test_a_slowed_profile_takes_longer_to_compute_but_moves_kv_as_fast() -> None:
    model = linear_model()
    slow = model.slowed(2.5)
    for shape in (BatchShape.prefill(300), BatchShape.decode(8, 900)):
        assert slow.iteration_time(shape) == pytest.approx(2.5 * model.iteration_time(shape))
    assert slow.transfer_time(512) == model.transfer_time(512)
    with pytest.raises(ValueError, match="positive"):
        model.slowed(0.0)


def test_matching_runs_the_study_in_the_host_time_units() -> None:
    cfg = FidelityConfig(profile="p.json", rate_scale=0.3, slo_ttft_ms=3000.0, slo_tpot_ms=300.0)
    speed = HostSpeed(2.0, {"prefill": 2.0})
    run, profile = matched(cfg, speed, linear_model())
    assert (run.rate_scale, run.slo_ttft_ms, run.slo_tpot_ms) == pytest.approx((0.15, 6000.0, 600.0))
    assert profile == linear_model().slowed(2.0) and run.limit == cfg.limit


def check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, speed: HostSpeed, match: bool
          ) -> tuple[FidelityConfig, dict]:
    monkeypatch.setattr(command, "measure_host", lambda *_: speed)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(linear_model().to_dict()))
    cfg = FidelityConfig(profile=str(profile))
    settings = {"profile": str(profile), "rate_scale": cfg.rate_scale, "slo_ttft_ms": cfg.slo_ttft_ms,
                "slo_tpot_ms": cfg.slo_tpot_ms}
    return command.check_host(cfg, settings, match, tmp_path)


def test_a_far_host_is_warned_about_and_the_study_is_left_as_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, settings = check(tmp_path, monkeypatch, HostSpeed(2.4, {"decode": 2.4}), match=False)
    err = capsys.readouterr().err
    assert "2.40x the profile's times" in err and "warning:" in err and "--host-check match" in err
    assert cfg == FidelityConfig(profile=str(tmp_path / "profile.json"))
    assert settings["host"] == {"ratio": 2.4, "by_kind": {"decode": 2.4}, "matched": False}
    assert host_lines(settings["host"])[0].endswith("the load was not matched to it.")
    check(tmp_path, monkeypatch, HostSpeed(1.1, {"decode": 1.1}), match=False)
    assert "warning:" not in capsys.readouterr().err


def test_a_matched_study_records_what_it_ran_and_what_was_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, settings = check(tmp_path, monkeypatch, HostSpeed(2.0, {"prefill": 2.0}), match=True)
    written = json.loads((tmp_path / "profile-host.json").read_text())
    assert written["prefill_intercept"] == pytest.approx(2 * linear_model().prefill_intercept)
    assert cfg.profile == settings["profile"] == str(tmp_path / "profile-host.json")
    assert (settings["rate_scale"], settings["slo_ttft_ms"]) == pytest.approx((0.15, 6000.0))
    asked = settings["host"]["asked"]
    assert asked["profile"] == str(tmp_path / "profile.json") and asked["rate_scale"] == 0.3
    assert host_lines(settings["host"])[0] == (
        "Host check: this host ran the engine at 2.00x the profile's times (prefill 2.00x); the load was "
        "matched to it: rate scale 0.3 x 0.50, SLOs 3000 / 300 ms and the profile's times x 2.00.")
    copy = tmp_path / "copied"
    assert study_profile(settings, copy) == copy / "profile-host.json", (
        "a matched study copied elsewhere replays with the profile in its own folder")
    unmatched = {**settings, "host": {**settings["host"], "matched": False}}
    assert study_profile(unmatched, copy) == Path(settings["profile"])
    assert study_profile({**settings, "profile": ""}, copy) == copy / "profile.json"


def test_host_check_is_a_choice_of_the_command() -> None:
    parser = argparse.ArgumentParser()
    options.add_fidelity_options(parser)
    assert parser.parse_args([]).host_check == "warn"
    with pytest.raises(SystemExit):
        parser.parse_args(["--host-check", "sometimes"])
