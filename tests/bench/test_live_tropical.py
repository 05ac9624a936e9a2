"""`tropical bench` against our own live server on tiny-random: every request measured, none lost."""

from __future__ import annotations

import json
from pathlib import Path

from tests.live_server import live_server
from tropical.cli import main


def test_bench_measures_our_server(tmp_path: Path, capsys) -> None:
    with live_server(tmp_path, "--policy", "tropical", "--max-model-len", "512") as server:
        code = main(["bench", "--url", server.url, "--trace", "conversation", "--limit", "10",
                     "--rate-scale", "20", "--length-scale", "0.02", "--json", "--out", str(tmp_path / "b")])
        served = server.output()
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and (summary["requests"], summary["completed"], summary["failed"]) == (10, 10, 0)
    assert summary["model"] == "tiny-random" and summary["ttft_p50_s"] > 0 and summary["tpot_p50_s"] > 0
    lines = [json.loads(line) for line in (tmp_path / "b" / "requests.jsonl").read_text().splitlines()]
    assert all(line["completion_tokens"] == line["max_tokens"] for line in lines), "ignore_eos is honoured"
    assert summary["token_counts_estimated"] == 0, "every chunk states its token count"
    assert all(sum(line["chunk_tokens"]) == line["completion_tokens"] for line in lines)
    paths = ("prefill", "multiplex", "fallback")
    assert all(line["path"] in paths and "prefill_worker" in line for line in lines)
    assert all(line["reason"] for line in lines), "the toggle's reason for each path is recorded"
    assert "Traceback" not in served
