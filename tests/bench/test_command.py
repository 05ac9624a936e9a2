"""``tropical bench`` end to end against the fake server: JSON, table, files, failures."""

from __future__ import annotations

import json

from tests.bench.fake_server import Script
from tropical.cli import main

JSON_KEYS = {"requests", "completed", "failed", "attainment", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s",
             "tpot_p90_s", "itl_p50_s", "itl_p90_s", "itl_p99_s", "chunk_gap_p50_s", "chunk_gap_p99_s",
             "chunk_gap_max_s", "stall_share", "goodput_rps", "duration_s"}
FAST = ["--trace", "conversation", "--limit", "6", "--rate-scale", "50", "--length-scale", "0.02"]


def bench(capsys, url: str, *extra: str) -> tuple[int, str]:
    code = main(["bench", "--url", url, *FAST, *extra])
    return code, capsys.readouterr().out


def test_json_and_out_dir_report_every_request(fake_server, capsys, tmp_path):
    url = fake_server(Script(first_delay=0.01, gap=0.002))
    code, out = bench(capsys, url, "--json", "--out", str(tmp_path))
    summary = json.loads(out)
    assert code == 0 and summary.keys() >= JSON_KEYS
    assert (summary["requests"], summary["completed"], summary["failed"]) == (6, 6, 0)
    assert summary["attainment"] == 1.0 and summary["goodput_rps"] > 0
    lines = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [line["id"] for line in lines] == list(range(6))
    assert all(line["completion_tokens"] == line["max_tokens"] and line["error"] is None for line in lines)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "latency_cdfs.png").stat().st_size > 0
    assert (tmp_path / "attainment_over_time.png").stat().st_size > 0


def test_requests_jsonl_records_token_counts_and_path_headers_only_when_sent(fake_server, capsys, tmp_path):
    headers = {"x-tropical-path": "prefill", "x-tropical-prefill-worker": "0"}
    url = fake_server(Script(first_delay=0.0, gap=0.0, state_tokens=True, headers=headers))
    bench(capsys, url, "--out", str(tmp_path / "ours"))
    bench(capsys, fake_server(Script(first_delay=0.0, gap=0.0)), "--out", str(tmp_path / "other"))
    ours, other = ([json.loads(line) for line in (tmp_path / d / "requests.jsonl").read_text().splitlines()]
                   for d in ("ours", "other"))
    assert all(r["path"] == "prefill" and r["prefill_worker"] == "0" for r in ours)
    assert all(r["chunk_tokens"] == [1] * r["completion_tokens"] for r in ours)
    assert not any("path" in r or "prefill_worker" in r or r["chunk_tokens"] for r in other)


def test_length_bounds_apply_after_the_scale_and_are_what_is_planned(fake_server, capsys, tmp_path):
    script = Script(first_delay=0.0, gap=0.0)
    bench(capsys, fake_server(script), "--min-input", "40", "--max-input", "60", "--max-output", "2",
          "--out", str(tmp_path))
    lines = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert all(40 <= r["prompt_tokens"] <= 60 and r["max_tokens"] <= 2 for r in lines)
    assert [len(b["prompt"]) for b in script.received] == [r["prompt_tokens"] for r in lines]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["min_input"], summary["max_input"], summary["max_output"]) == (40, 60, 2)


def test_a_length_only_trace_is_replayed_at_the_given_rate(fake_server, capsys, tmp_path):
    trace = tmp_path / "lengths.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n" + "12,2\n" * 5)
    code = main(["bench", "--url", fake_server(Script(first_delay=0.0, gap=0.0)), "--trace", str(trace),
                 "--rate", "40", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["completed"] == 5 and summary["arrival_rate"] == 40.0


def test_prompts_are_capped_to_the_servers_context(fake_server, capsys):
    script = Script(first_delay=0.0, gap=0.0, max_model_len=64)
    code, out = bench(capsys, fake_server(script), "--json")
    assert code == 0 and json.loads(out)["prompts_capped"] > 0
    assert all(len(b["prompt"]) + b["max_tokens"] <= 64 for b in script.received)


def test_text_prompts_and_the_table(fake_server, capsys):
    script = Script(first_delay=0.0, gap=0.0)
    code, out = bench(capsys, fake_server(script), "--prompt-format", "text", "--slo-ttft-ms", "1000")
    assert code == 0 and all(isinstance(b["prompt"], str) for b in script.received)
    assert "TTFT (s)" in out and "ITL per token (s)" in out and "chunk gap (s)" in out
    assert "SLO attainment 100.0%" in out and "stalls (chunk gap > 1 s) in 0.0%" in out


def test_a_failing_server_is_reported_not_dropped(fake_server, capsys):
    code, out = bench(capsys, fake_server(Script(status=500)), "--json")
    summary = json.loads(out)
    assert code == 0 and (summary["requests"], summary["failed"], summary["attainment"]) == (6, 6, 0.0)
    assert list(summary["failures"].values()) == [6]


def test_bad_flags_are_clear_errors(capsys):
    assert main(["bench", "--url", "http://127.0.0.1:1", "--rate-scale", "0"]) == 2
    assert "--rate-scale must be positive" in capsys.readouterr().err
    assert main(["bench", "--url", "http://127.0.0.1:1", "--min-output", "5", "--max-output", "2"]) == 2
    assert "--min-output (5) is above --max-output (2)" in capsys.readouterr().err


def test_the_prefix_hit_rate_is_cached_tokens_over_prompt_tokens(fake_server, capsys, tmp_path):
    url = fake_server(Script(first_delay=0.0, gap=0.0, prompt_tokens=10, cached_tokens=4))
    code, out = bench(capsys, url, "--json", "--out", str(tmp_path))
    summary = json.loads(out)
    assert code == 0 and summary["prefix_hit_rate"] == 0.4 and summary["cached_tokens"] == 6 * 4
    lines = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [line["cached_tokens"] for line in lines] == [4] * 6
    assert "40.0% of prompt tokens cached (24 tokens" in bench(capsys, url)[1]


def test_a_server_that_reports_no_cached_tokens_has_no_hit_rate(fake_server, capsys):
    url = fake_server(Script(first_delay=0.0, gap=0.0))
    summary = json.loads(bench(capsys, url, "--json")[1])
    assert summary["prefix_hit_rate"] is None and summary["cached_tokens"] == 0
    assert "the server reported no cached_tokens" in bench(capsys, url)[1]
