"""The ``tropical`` command as a user runs it (in-process, on a small fitted profile)."""

import json

import pytest

from tests.factories import linear_model
from tropical.cli import main
from tropical.config import SimConfig, read_config_file

SIM_KEYS = {"policy", "requests", "attainment", "ttft_p90_s", "tpot_p90_s", "queue_p90_s", "sim_wall_s"}


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(linear_model(kv_bytes_per_token=196608).to_dict()))
    return str(path)


def run_json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("policy", ["colocated", "chunked", "disagg", "tropical"])
def test_sim_json_has_the_agreed_keys(capsys, profile, policy):
    out = run_json(capsys, "sim", "--trace", "conversation", "--cluster", "paper", "--policy", policy,
                   "--limit", "200", "--profile", profile, "--json")
    assert out.keys() >= SIM_KEYS
    assert out["policy"] == policy and out["requests"] == 200
    assert 0 <= out["attainment"] <= 1


def test_sim_prints_a_table(capsys, profile):
    assert main(["sim", "--policy", "disagg", "--limit", "50", "--profile", profile]) == 0
    text = capsys.readouterr().out
    assert "TTFT (s)" in text and "SLO attainment" in text


def test_sweep_reports_capacity_per_policy(capsys, profile):
    out = run_json(capsys, "sweep", "--policies", "colocated,disagg", "--limit", "150",
                   "--profile", profile, "--tol", "0.1", "--json")
    assert set(out["capacity_rps"]) == {"colocated", "disagg"} == set(out["stream_capacity_rps"])
    assert all(v > 0 for v in out["capacity_rps"].values())
    assert out["stream_capacity_rps"]["colocated"] < out["capacity_rps"]["colocated"]  # it stalls
    assert all(out["stream_capacity_rps"][p] <= out["capacity_rps"][p] for p in out["capacity_rps"])
    assert 0 < out["pooled_bound_rps"] <= out["bound_rps"]


def test_sweep_bound_falls_with_a_tight_tpot_slo(capsys, profile):
    def bound(tpot_scale: str) -> float:
        return run_json(capsys, "sweep", "--policies", "colocated", "--limit", "60", "--profile",
                        profile, "--tol", "0.2", "--tpot-scale", tpot_scale, "--json")["bound_rps"]
    assert bound("1.2") < bound("5")


def test_a_tighter_tbt_slo_lowers_stream_attainment_only(capsys, profile):
    loose = run_json(capsys, "sim", "--policy", "colocated", "--limit", "150", "--profile", profile,
                     "--rate-scale", "0.05", "--json")
    tight = run_json(capsys, "sim", "--policy", "colocated", "--limit", "150", "--profile", profile,
                     "--rate-scale", "0.05", "--tbt-scale", "1", "--json")
    assert tight["attainment"] == loose["attainment"]
    assert tight["stream_attainment"] < loose["stream_attainment"]


def test_sweep_runs_a_vidur_length_trace_at_a_given_rate(tmp_path, capsys, profile):
    trace = tmp_path / "arxiv.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                     + "".join(f"{300 + 37 * i % 900},{20 + i % 50},0,0\n" for i in range(120)))
    out = run_json(capsys, "sweep", "--trace", str(trace), "--rate", "2", "--arrival-cv", "2",
                   "--policies", "colocated", "--profile", profile, "--tol", "0.1", "--json")
    assert out["requests"] == 120 and out["capacity_rps"]["colocated"] > 0
    assert main(["sim", "--trace", str(trace), "--profile", profile]) == 2
    assert "give a request rate (--rate R)" in capsys.readouterr().err


def test_length_bounds_clamp_the_simulated_requests(capsys, profile):
    args = ("sim", "--limit", "60", "--policy", "colocated", "--profile", profile, "--json")
    wide, bounded = run_json(capsys, *args), run_json(capsys, *args, "--max-input", "64", "--max-output", "4")
    assert bounded["ttft_p90_s"] < wide["ttft_p90_s"] and bounded["e2e_p90_s"] < wide["e2e_p90_s"]


def test_unknown_policy_is_a_clear_error(capsys, profile):
    assert main(["sim", "--policy", "fastest", "--profile", profile]) == 2
    assert "unknown policy 'fastest'" in capsys.readouterr().err


def test_missing_trace_names_the_builtins(capsys, profile):
    assert main(["sim", "--trace", "nowhere.jsonl", "--profile", profile]) == 2
    assert "conversation" in capsys.readouterr().err


def test_config_file_sits_between_preset_and_flags(tmp_path, capsys, profile):
    cfg = tmp_path / "exp.toml"
    cfg.write_text('policy = "chunked"\nlimit = 40\nworkers = 2\n')
    out = run_json(capsys, "sim", "--config", str(cfg), "--limit", "30", "--profile", profile, "--json")
    assert out["policy"] == "chunked" and out["requests"] == 30 and len(out["workers"]) == 2


def test_config_file_with_unknown_setting_is_refused(tmp_path):
    cfg = tmp_path / "exp.json"
    cfg.write_text('{"polcy": "chunked"}')
    with pytest.raises(ValueError, match="polcy"):
        SimConfig().updated(read_config_file(cfg), str(cfg))


def test_absolute_slos_apply_to_every_request(capsys, profile):
    loose = run_json(capsys, "sim", "--policy", "disagg", "--limit", "100", "--profile", profile,
                     "--slo-ttft-ms", "1e9", "--slo-tpot-ms", "1e9", "--json")
    assert loose["attainment"] == 1.0


def test_config_setting_of_the_wrong_type_is_refused(tmp_path):
    cfg = tmp_path / "exp.toml"
    cfg.write_text('max_batched_tokens = "many"\n')
    with pytest.raises(ValueError, match="max_batched_tokens must be int"):
        SimConfig().updated(read_config_file(cfg), str(cfg))


def test_workers_may_be_on_different_gpus(capsys):
    out = run_json(capsys, "sim", "--policy", "disagg", "--limit", "200", "--rate-scale", "0.2",
                   "--gpu", "h100-80gb,h100-80gb,a100-80gb,a100-80gb", "--json")
    prefill = [w["prefill_tokens"] for w in out["workers"]]
    assert prefill[0] > 0 and prefill[2] == 0
    with pytest.raises(ValueError, match="names 3 GPUs"):
        from tropical.sim.build import worker_gpus
        worker_gpus(SimConfig(gpu="a100,a100,h100", workers=4))


def test_slo_classes_give_requests_their_own_targets(capsys, profile):
    loose_half = run_json(capsys, "sim", "--policy", "chunked", "--limit", "300", "--profile", profile,
                          "--rate-scale", "5", "--slo-classes", "0.5:ttft_ms=1e9:tpot_ms=1e9,0.5:ttft_ms=1",
                          "--json")
    assert 0.35 < loose_half["attainment"] < 0.65
    assert main(["sim", "--slo-classes", "0.5:latency=3", "--profile", profile]) == 2
    assert "SLO class" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--limit", "0"], "no requests"),
    (["--rate-scale", "-1"], "rate_scale"),
    (["--policy", "tropical", "--watermark", "2"], "watermark"),
    (["--prefill-workers", "4", "--policy", "disagg"], "prefill workers"),
    (["--gpu", "tpu"], "unknown GPU"),
    (["--arrivals", "weird"], "unknown arrivals"),
])
def test_bad_settings_get_clear_errors(capsys, profile, argv, message):
    assert main(["sim", "--profile", profile, *argv]) == 2
    assert message in capsys.readouterr().err


def test_generate_prints_a_completion(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TROPICAL_CACHE", str(tmp_path))
    assert main(["generate", "--model", "tiny-random", "--prompt", "hello there", "--max-tokens", "5"]) == 0
    assert capsys.readouterr().out.strip() != ""
    assert main(["generate", "--model", "tiny-random", "--prompt", "hi", "--max-tokens", "0"]) == 2
    assert "max_tokens" in capsys.readouterr().err


def test_profile_writes_a_profile_the_simulator_loads(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TROPICAL_CACHE", str(tmp_path))
    out = tmp_path / "tiny.json"
    assert main(["profile", "--model", "tiny-random", "--out", str(out)]) == 0
    assert "median error" in capsys.readouterr().out
    from tropical.calibration.store import load_profile
    from tropical.core.latency.shape import BatchShape

    profile = load_profile(out)
    one, eight = (profile.iteration_time(BatchShape.decode(n, n * 128)) for n in (1, 8))
    short, long = (profile.iteration_time(BatchShape.prefill(n)) for n in (16, 512))
    # the fit is non-negative, so more work is never cheaper; a tiny model's decode batch of
    # 8 may cost no more than 1 within the timing noise of a loaded machine, a 32x prompt must
    assert 0 < one <= eight and 0 < short < long, "the measured profile must price more work as longer"


def test_export_writes_a_directory_that_serves_like_the_model(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TROPICAL_CACHE", str(tmp_path))
    out = tmp_path / "exported"
    assert main(["export", "--model", "tiny-random", "--out", str(out)]) == 0
    assert f"tropical serve --model {out}" in capsys.readouterr().out
    replies = []
    for model in ("tiny-random", str(out)):
        assert main(["generate", "--model", model, "--prompt", "hello there", "--max-tokens", "12"]) == 0
        replies.append(capsys.readouterr().out)
    assert replies[0].strip() and replies[0] == replies[1], "the export must answer the same greedy tokens"
