"""The fidelity study's parts: the simulator's twin of a server, the serving adjustment, one live run."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from tests.factories import linear_model
from tropical.bench.output import request_line
from tropical.bench.plan import PlannedRequest
from tropical.bench.prompts import token_ids
from tropical.bench.record import Measurement
from tropical.calibration.store import load_profile
from tropical.cli import main
from tropical.core.latency.adjusted import AdjustedModel
from tropical.core.latency.fitted import FittedModel
from tropical.core.latency.shape import BatchShape
from tropical.core.metrics import tpot, ttft
from tropical.core.request import PrefillPath as RequestPath
from tropical.core.slo import SLO
from tropical.engine.block_hash import block_hashes
from tropical.engine.profiler import QUICK, profile_model, write_profile
from tropical.fidelity.compare import METRICS
from tropical.fidelity.overheads import (
    adjusted,
    frontend_latency,
    measured_speed,
    profile_ratio,
    transfer_scale,
)
from tropical.fidelity.replay import load_run
from tropical.fidelity.run import FidelityConfig
from tropical.fidelity.twin import ServerShape, simulate_twin
from tropical.serve.iteration_log import IterationRecord, read_iterations

SHAPE = ServerShape(kv_tokens=4096, block_size=16, max_model_len=512, max_batched_tokens=256)


def test_adjusted_model_scales_compute_and_adds_overhead() -> None:
    base = linear_model()
    model = AdjustedModel(base, scale=2.0, overhead=0.01, transfer_scale=3.0)
    shape = BatchShape.prefill(100)
    assert model.iteration_time(shape) == pytest.approx(2 * base.iteration_time(shape) + 0.01)
    base_intercept, base_slope = base.decode_line(4)
    assert model.decode_line(4) == pytest.approx((2 * base_intercept + 0.01, 2 * base_slope))
    assert model.transfer_time(64) == pytest.approx(3 * base.transfer_time(64))
    with pytest.raises(ValueError, match="scale"):
        AdjustedModel(base, scale=0.0)


def test_adjustment_comes_from_the_servers_counters() -> None:
    totals = {"tropical_iterations_total": 10.0, "tropical_iteration_compute_seconds_total": 3.0,
              "tropical_iteration_predicted_seconds_total": 2.0, "tropical_iteration_wall_seconds_total": 3.5,
              "tropical_migration_seconds_sum": 1.0}
    model = adjusted(linear_model(), totals)
    assert (model.scale, model.overhead, model.transfer_scale) == pytest.approx((1.5, 0.05, 1.0))
    assert adjusted(linear_model(), {}).scale == 1.0
    server_ttft = {"tropical_ttft_seconds_count": 4.0, "tropical_ttft_seconds_sum": 0.4}
    assert frontend_latency(server_ttft, 0.13) == pytest.approx(0.03)
    assert frontend_latency({}, 0.13) == 0.0


def test_kv_moves_take_the_servers_measured_time_over_the_profiles() -> None:
    """Two moves of 100 and 200 tokens took three times what the profile prices them at."""
    base = linear_model()
    seconds = 3 * (base.transfer_time(100) + base.transfer_time(200))
    totals = {"tropical_migrations_total": 2.0, "tropical_migrated_tokens_total": 300.0,
              "tropical_migration_seconds_sum": seconds}
    assert transfer_scale(base, totals) == pytest.approx(3.0)
    assert adjusted(base, totals).transfer_scale == pytest.approx(3.0)
    assert transfer_scale(base, {"tropical_migration_seconds_sum": 1.0}) == 1.0, "nothing migrated"


def test_measured_speed_is_the_profile_refitted_to_the_runs_iterations() -> None:
    """The run's engine decodes 3x slower per sequence than profiled and prefills as profiled: a
    refit carries both, where one compute scale could only average them."""
    profile, live = linear_model(), linear_model(decode_per_seq=3e-4, decode_intercept=0.002)
    shapes = [BatchShape.decode(b, b * c) for b in (1, 4, 16) for c in (100, 400)]
    shapes += [BatchShape.prefill(n, k) for n in (50, 200, 800) for k in (0, 100)]
    shapes += [BatchShape.of_batch([(n, 0)], b, b * 200) for n in (100, 400) for b in (2, 8)]
    records = [IterationRecord(0, float(i), s, live.iteration_time(s) + 0.003, live.iteration_time(s),
                               profile.iteration_time(s)) for i, s in enumerate(shapes)]
    speed, idle = measured_speed(profile, records, workers=2)
    assert speed.overhead == pytest.approx(0.003) and speed.scale == pytest.approx(1.0)
    assert idle == speed, "a worker that ran nothing gets the pooled speed"
    unseen = (BatchShape.decode(8, 2400), BatchShape.prefill(300), BatchShape.of_batch([(150, 0)], 4, 800))
    for shape in unseen:
        assert speed.iteration_time(shape) == pytest.approx(live.iteration_time(shape) + 0.003, rel=1e-3)
    assert speed.transfer_time(100) == profile.transfer_time(100)


def test_each_workers_speed_sums_to_its_live_compute_time() -> None:
    """Contention slows one worker's iterations now and then: the refit follows the typical
    iteration, the worker's scale makes its iterations' sum match what they took live."""
    live = linear_model()
    shapes = [BatchShape.decode(b, b * 300) for b in (1, 2, 4, 8)] * 5
    shapes += [BatchShape.prefill(n) for n in (64, 512)] * 5
    slowdown = [3.0 if i % 10 == 0 else 1.0 for i in range(len(shapes))]
    records = [IterationRecord(i % 2, float(i), s, 1.0, live.iteration_time(s) * slowdown[i],
                               live.iteration_time(s)) for i, s in enumerate(shapes)]
    speeds = measured_speed(live, records, workers=2)
    for w, speed in enumerate(speeds):
        mine = [r for r in records if r.worker == w]
        assert sum(speed.iteration_time(r.shape) - speed.overhead for r in mine) == pytest.approx(
            sum(r.compute for r in mine))
    assert speeds[0].scale > 1.2 * speeds[1].scale, "worker 0 had every 3x slow iteration"


def test_profile_ratio_is_the_runs_compute_over_the_profiles_price() -> None:
    profile = linear_model()
    shapes = [BatchShape.decode(4, 1200), BatchShape.prefill(300)]
    records = [IterationRecord(0, 0.0, s, 1.0, 2 * profile.iteration_time(s), 0.0) for s in shapes]
    records.append(IterationRecord(1, 0.0, BatchShape.prefill(900), 1.0, 0.0, 0.0))  # not timed: left out
    assert profile_ratio(profile, records) == pytest.approx(2.0)
    assert math.isnan(profile_ratio(profile, []))


@pytest.mark.parametrize("policy", ["colocated", "disagg", "tropical"])
def test_twin_simulates_every_planned_request(policy: str) -> None:
    planned = [PlannedRequest(i, 0.05 * i, 40 + i, 5) for i in range(12)]
    done = simulate_twin(planned, SLO(1.0, 0.1), policy, SHAPE, linear_model()).requests
    assert [r.id for r in done] == list(range(12)) and all(r.error is None and r.finish for r in done)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("fidelity") / "profile.json"
    write_profile(profile_model("tiny-random", QUICK), path)
    return str(path)


def test_the_command_runs_a_policy_live_and_against_its_twin(tmp_path: Path, profile: str, capsys) -> None:
    """One repeat keeps CI fast (each repeat starts a server); repeats are specified in test_repeats."""
    out = tmp_path / "fid"
    code = main(["fidelity", "--model", "tiny-random", "--profile", profile, "--policies", "tropical",
                 "--limit", "8", "--repeats", "1", "--rate-scale", "10", "--length-scale", "0.02",
                 "--kv-tokens", "4096", "--max-model-len", "512", "--max-batched-tokens", "256",
                 "--out", str(out), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0 and json.loads((out / "fidelity.json").read_text()) == document
    host = document["config"]["host"]
    assert host["ratio"] > 0 and not host["matched"], "the engine is timed against the profile before the run"
    assert document["path_agreement"] is not None and document["median_abs_error"] is not None
    [policy] = document["policies"]
    assert policy["repeats"] == 1 and len(policy["runs"]) == 1
    assert policy["paths"]["compared"] == 8, "every request's x-tropical-path is compared with the twin's"
    ttft = policy["real"]["ttft_p50_s"]
    assert ttft["min"] <= ttft["mean"] <= ttft["max"] and set(policy["sim_within_spread"]) >= set(METRICS)
    run = policy["runs"][0]
    assert run["real_completed"] == 8 and not math.isnan(run["relative_error"]["ttft_p50_s"])
    records = read_iterations(out / "logs" / "serve-tropical-1.iterations.jsonl")
    assert_runs_at_logged_speed(run["adjustment"], records, load_profile(profile))
    assert run["adjustment"]["frontend_s"] > 0, "HTTP adds to the router's own TTFT"
    assert run["sim_goodput_rps"] > 0
    assert set(run["sim_ttft_p90_s_at_drift"]) == {"0.98", "1.02"} and policy["ttft_p90_drift_width"] > 0
    assert run["adjustment"]["transfer_scale"] > 0 and run["adjustment"]["profile_ratio"] > 0
    assert (out / "tropical" / "1" / "requests.jsonl").exists()
    assert "Path agreement" in (out / "fidelity.md").read_text()
    assert run["real_prefix_hit_rate"] is not None and run["sim_prefix_hit_rate"] is not None
    assert "Prefix cache hits, share of prompt tokens" in (out / "fidelity.md").read_text()
    assert (out / "fidelity.md").read_text().startswith("Host check: this host ran the engine at")
    assert main(["fidelity", "--replay", str(out), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert replayed == document, "a replay prices exactly the recorded runs, as the live study did"
    (out / "logs" / "serve-tropical-1.iterations.jsonl").unlink()
    assert main(["fidelity", "--replay", str(out)]) != 0
    assert "iterations.jsonl.gz: missing" in capsys.readouterr().err
    (out / "tropical" / "1" / "twin.json").unlink()  # as if the study had been cut short in its run
    assert main(["fidelity", "--replay", str(out)]) != 0
    assert "no finished run to replay" in capsys.readouterr().err


def assert_runs_at_logged_speed(adjustment: dict, records: list[IterationRecord],
                                profile: FittedModel) -> None:
    """Each twin worker takes, in sum, the compute time the server logged for that worker, plus
    the worker's mean gap between router wall time and compute; the profile ratio is the logged
    compute over the profile's prices for the same iterations."""
    speed = FittedModel.from_dict(adjustment["speed"])
    scales, overheads = adjustment["compute_scale"], adjustment["iteration_overhead_s"]
    for worker, (scale, overhead) in enumerate(zip(scales, overheads, strict=True)):
        mine = [r for r in records if r.worker == worker]
        assert mine, f"worker {worker} logged no iteration"
        priced = sum(speed.iteration_time(r.shape) for r in mine)
        assert scale * priced == pytest.approx(sum(r.compute for r in mine))
        assert overhead == pytest.approx(max(0.0, sum(r.wall - r.compute for r in mine) / len(mine)))
    timed = [r for r in records if r.compute > 0]
    logged = sum(r.compute for r in timed) / sum(profile.iteration_time(r.shape) for r in timed)
    assert adjustment["profile_ratio"] == pytest.approx(logged)


def test_the_twin_books_its_gaps_between_tokens() -> None:
    planned = [PlannedRequest(i, 0.05 * i, 40 + i, 5) for i in range(12)]
    summary = simulate_twin(planned, SLO(1.0, 0.1), "chunked", SHAPE, linear_model()).summary()
    assert 0 < summary.itl.p50 <= summary.itl.p99 and summary.stall_share == 0.0


def test_each_twin_worker_runs_at_its_own_speed() -> None:
    planned = [PlannedRequest(0, 0.0, 50, 6)]
    slow_decoder = [linear_model(), AdjustedModel(linear_model(), scale=10.0)]
    slo = SLO(1.0, 0.1)
    bare = simulate_twin(planned, slo, "disagg", SHAPE, linear_model()).requests[0]
    twin = simulate_twin(planned, slo, "disagg", SHAPE, slow_decoder, predictor=linear_model()).requests[0]
    assert ttft(twin) == pytest.approx(ttft(bare)) and tpot(twin) == pytest.approx(10 * tpot(bare), rel=0.05)
    with pytest.raises(ValueError, match="runs 2 workers; got 3 latency models"):
        simulate_twin(planned, SLO(1.0, 0.1), "disagg", SHAPE, [linear_model()] * 3)


def test_frontend_latency_adds_to_ttft_not_tpot() -> None:
    planned = [PlannedRequest(0, 0.0, 50, 4)]
    slo = SLO(1.0, 0.1)
    bare = simulate_twin(planned, slo, "colocated", SHAPE, linear_model()).requests[0]
    slow = simulate_twin(planned, slo, "colocated", SHAPE, linear_model(), frontend=0.25).requests[0]
    assert ttft(slow) == pytest.approx(ttft(bare) + 0.25) and tpot(slow) == pytest.approx(tpot(bare))
    assert slow.arrival == 0.0


def test_a_study_needs_at_least_one_repeat() -> None:
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        FidelityConfig("profile.json", SHAPE, repeats=0)


def test_twin_decides_with_the_servers_predictor_but_runs_at_the_measured_speed() -> None:
    planned = [PlannedRequest(0, 0.0, 400, 5)]
    slo, slow = SLO(0.2, 0.5), AdjustedModel(linear_model(), scale=10.0)
    bare = simulate_twin(planned, slo, "tropical", SHAPE, linear_model()).requests[0]
    judged_slow = simulate_twin(planned, slo, "tropical", SHAPE, slow).requests[0]
    twin = simulate_twin(planned, slo, "tropical", SHAPE, slow, predictor=linear_model()).requests[0]
    assert bare.path is RequestPath.PREFILL_WORKER and judged_slow.path is not RequestPath.PREFILL_WORKER
    assert twin.path is bare.path and twin.reason == bare.reason
    assert ttft(twin) > 5 * ttft(bare), "the twin still runs at the measured (10x slower) speed"


def test_the_server_decides_by_the_studys_slos_as_its_twin_does() -> None:
    config = FidelityConfig("p.json", SHAPE, slo_ttft_ms=3000.0, slo_tpot_ms=300.0)
    args = config.serve_args("tropical+", Path("it.jsonl"))
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert (float(flags["--slo-ttft-ms"]), float(flags["--slo-tpot-ms"])) == (3000.0, 300.0)
    assert flags["--policy"] == "tropical+" and flags["--iteration-log"] == "it.jsonl"


def test_the_twin_hits_where_the_clients_prompts_share_blocks() -> None:
    """Four requests open with the same trace block (512 tokens, cut to their 100-token prompts):
    each after the first finds the first 96 tokens (6 whole blocks of 16, short of its last token)
    cached on the one colocated worker; the server names them by the same hashes of the same ids."""
    shape = replace(SHAPE, workers="colocated", prefix_cache=True)
    planned = [PlannedRequest(i, 1.0 * i, 100, 3, prefix_blocks=(7,)) for i in range(4)]
    twin = simulate_twin(planned, SLO(1.0, 0.1), "colocated", shape, linear_model(), seed=3)
    assert [r.cached for r in twin.requests] == [0, 96, 96, 96]
    assert twin.summary().prefix_hit_rate == pytest.approx(3 * 96 / 400)
    assert twin.requests[1].prefix == block_hashes(token_ids(planned[1], 3), 16)
    alone = [replace(p, prefix_blocks=()) for p in planned]
    for requests, server in ((alone, shape), (planned, replace(shape, prefix_cache=False))):
        assert simulate_twin(requests, SLO(1.0, 0.1), "colocated", server, linear_model()).summary(
            ).prefix_hit_rate == 0


def test_the_server_runs_with_the_prefix_cache_the_twin_models() -> None:
    for on, flag in ((True, "on"), (False, "off")):
        config = FidelityConfig("p.json", replace(SHAPE, prefix_cache=on))
        args = config.serve_args("tropical+", Path("it.jsonl"))
        assert dict(zip(args[::2], args[1::2], strict=True))["--prefix-cache"] == flag


def test_a_replay_reads_back_each_prompts_blocks_and_the_servers_hits(tmp_path: Path) -> None:
    """What the twin of a replayed run shares and what it is compared with come from requests.jsonl."""
    planned = PlannedRequest(0, 0.5, 100, 3, prefix_blocks=(7, 9))
    m = Measurement(0, 100, 3, 0.5, [0.7, 0.8, 0.9], [1, 1, 1], 3, saw_done=True, cached_tokens=64)
    line = request_line(planned, m, m.to_request(SLO(1.0, 0.1)))
    (tmp_path / "requests.jsonl").write_text(json.dumps(line) + "\n")
    run = load_run(tmp_path, SLO(1.0, 0.1))
    assert run.planned[0].prefix_blocks == (7, 9) and run.measured[0].cached_tokens == 64


def test_prompts_cut_to_a_length_keep_the_traces_shared_blocks() -> None:
    bench = FidelityConfig("p.json", SHAPE, max_input=1024, max_output=8).bench("http://x")
    assert (bench.max_input, bench.max_output) == (1024, 8)
