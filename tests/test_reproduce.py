"""``tropical reproduce`` end to end on a small slice: tables, plots, report and JSON."""

import json

import pytest

from tropical.cli import main


def test_reproduce_writes_report_plots_and_json(tmp_path, capsys):
    out = tmp_path / "rep"
    code = main(["reproduce", "--limit", "200", "--sensitivity-limit", "80", "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    paper = {"colocated", "chunked-512", "chunked-1024", "chunked-2048", "disagg", "disagg-1p",
             "disagg-3p"}  # the paper cluster's 4 workers: disagg at 1, 2 and 3 prefill workers
    baselines = paper | {"kv-router", "kv-router-1024", "kv-router-2048", "kv-router-disagg"}
    policies = baselines | {"tropical", "tropical+"}
    for key in ("capacity_rps", "ratio_vs_best_baseline", "stream_capacity_rps",
                "stream_ratio_vs_best_baseline"):
        assert set(result[key]) == policies
    for metric in ("", "stream_"):
        capacity = result[f"{metric}capacity_rps"]
        best = max(capacity[p] for p in baselines)
        assert best > 0, f"no baseline reached 90% {metric}attainment at any rate"
        for policy, ratio in result[f"{metric}ratio_vs_best_baseline"].items():
            assert ratio == pytest.approx(capacity[policy] / best), (metric, policy)
    assert all(result["stream_capacity_rps"][p] <= result["capacity_rps"][p] for p in policies)
    assert result["bound_rps"] > 0     # a finite slice may be served past it (the report shows deferral)
    assert 0 < result["pooled_bound_rps"] <= result["bound_rps"]    # the trace's bursts kept
    assert 0 < result["kserver_bound_rps"] <= result["bound_rps"]   # each prompt on one worker
    assert set(result["prefix_hit_rate"]) == policies                # the cache is on by default
    assert result["host_kv"] == 0                                      # with no host tier under it
    ideal = result["ideal_prefix_hit_rate"]["infinite"]
    assert all(0 <= h <= ideal for h in result["prefix_hit_rate"].values())
    ideal_bounds = result["ideal_cache_bound_rps"]
    assert ideal_bounds["kv_lru"] <= ideal_bounds["infinite"] == pytest.approx(result["bound_rps"])
    plain = result["paper_setting"]
    assert set(plain["capacity_rps"]["no prefix cache"]) == paper | {"tropical", "tropical+"}
    assert plain["bound_rps"]["no prefix cache"] < result["bound_rps"]    # reuse lowers the work
    overload = result["overload"]       # goodput past the bound, every policy and admission mode
    assert set(overload) == policies
    for modes in overload.values():
        assert set(modes) == {"none", "early-reject", "predictive"}
        assert all(set(shares) == {"1.5", "2.0"} and min(shares.values()) >= 0 for shares in modes.values())
    admitted = result["capacity_with_admission_rps"]    # capacity that no deferral reaches
    assert set(admitted) == policies
    for p, modes in admitted.items():
        assert set(modes) == {"none", "early-reject", "predictive"}
        assert modes["none"] == result["capacity_rps"][p]
    best = max(max(admitted[p].values()) for p in baselines)
    for p, r in result["ratio_vs_best_baseline_with_admission"].items():
        assert r == pytest.approx(max(admitted[p].values()) / best)
    for name in ("report.md", "attainment_vs_rate.png", "capacities.png", "latency_cdfs.png",
                 "queueing.png", "overload.png", "reproduction.json"):
        assert (out / name).stat().st_size > 0
    written = json.loads((out / "reproduction.json").read_text())
    for at in ("at_own_capacity", "at_common_rate"):     # deferral at each capacity and at equal load
        for p in policies:
            assert 0 <= written[at][p]["queued_work_share"] <= 1
            assert 0 <= written[at][p]["queued_missed_work_s"] <= written[at][p]["queued_work_s"]
            assert written[at][p]["unwaited_work_s"] >= 0
    sensitivity = written["sensitivity"]
    slo_bounds = sensitivity["SLO"]["bound_rps"]
    assert set(slo_bounds) == set(sensitivity["SLO"]["capacity_rps"])
    assert slo_bounds["TPOT 1.5x, TTFT 5x"] <= slo_bounds["TPOT 3x, TTFT 5x"]  # tight TPOT, small batches
    pooled = sensitivity["trace"]["pooled_bound_rps"]
    assert all(0 < pooled[t] <= sensitivity["trace"]["bound_rps"][t] for t in pooled)
    assert set(sensitivity["trace"]["kserver_bound_rps"]) == set(pooled)
    report = (out / "report.md").read_text()
    for heading in ("Goodput capacity", "Work bound", "Pooled bound", "K-server bound",
                    "of work / k-server / pooled bound",
                    "work bound (most vs best baseline)", "pooled bound (most vs best baseline)",
                    "Headroom in the sensitivity rows", "work queued at last arrival",
                    "Past capacity: goodput under each admission mode",
                    "Capacity with admission", "**Best baseline with admission**",
                    "had no request waited", "Analysis",
                    "ablation", "chunked multiplexing", "predictor noise", "role split",
                    "TPOT 2x, TTFT 5x", "synthetic", "azure-code", "stall", "Prefix caching",
                    "The paper's setting: no prefix cache", "cache-blind Path 1 dispatch",
                    "**Reuse.**", "work bound at its own reuse",
                    "*x0.25*: lengths scaled by 0.25: the trace's prefix blocks no longer describe",
                    "*azure-code*: trace azure-code records no prefix hashes"):
        assert heading in report
    assert (out / "attainment_vs_rate.png").read_bytes()[:4] == b"\x89PNG"


def test_reproduce_runs_a_length_only_file_trace_at_a_given_rate(tmp_path, capsys):
    trace = tmp_path / "lengths.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{500 + 613 * i % 3000},{20 + 7 * i % 200}\n" for i in range(100)))
    code = main(["reproduce", "--trace", str(trace), "--rate", "2", "--sensitivity-limit", "40",
                 "--host-kv", "2", "--out", str(tmp_path / "rep"), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert all(c > 0 for c in result["capacity_rps"].values())
    assert result["host_kv"] == 2 and result["host_tier"] == "per-worker"
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "lengths" in report and "host memory 2x its KV pool" in report
