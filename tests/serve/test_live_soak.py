"""The chaos soak in small (benchmarks/soak.py): a minute of a live Ray-backed server with one worker
SIGKILLed and one burst; every request sent is answered, none hangs, the killed worker comes back."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tropical.bench.record import Measurement

SOAK = Path(__file__).parents[2] / "benchmarks" / "soak.py"


def test_a_short_soak_loses_nothing_and_hangs_nothing(tmp_path: Path) -> None:
    args = ["--model", "tiny-random", "--minutes", "0.75", "--rate", "2", "--kill-every", "25",
            "--burst-every", "30", "--burst-seconds", "5", "--deadline", "60", "--sample-every", "2"]
    run = subprocess.run([sys.executable, str(SOAK), *args, "--out", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    outcomes = report["outcomes"]
    assert report["sent"] >= 60 and sum(outcomes.values()) == report["sent"]
    assert outcomes["lost"] == 0 and outcomes["hung"] == 0, report["errors"]
    assert outcomes["5xx"] == 0, "two workers decode: one killed never leaves the fleet without a decoder"
    assert outcomes["ok"] >= 0.9 * report["sent"], report["errors"]
    [kill] = report["kills"]
    assert kill["pid"] is not None and kill["revived_s"] is not None, kill
    assert report["rss_samples"] and report["rss_mib"]["router"]["first_mib"] > 0
    assert {p.name for p in tmp_path.iterdir()} >= {"soak.json", "soak.md", "soak.png", "serve.log"}


def _soak_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_request_ends_in_one_outcome() -> None:
    soak = _soak_module()
    ended = {None: "ok", "timed out after 60 s": "hung", "HTTP 429: busy": "rejected",
             "HTTP 503: none": "5xx", "HTTP 400: bad": "failed", "server error: worker 1 died": "failed",
             "stream ended without [DONE]": "lost", "RemoteProtocolError: peer closed": "lost"}
    for error, outcome in ended.items():
        m = Measurement(0, 1, 1)
        m.error = error
        assert soak.outcome(m) == outcome, error


def test_a_burst_plays_the_trace_faster_for_its_seconds_only() -> None:
    chaos = _soak_module().Chaos(60, 20, 10, 5, 3)
    assert chaos.bursts() == [10, 20, 30, 40, 50] and chaos.kills() == [20, 40]
    assert chaos.trace_seconds() == 60 + 2 * 5 * 5
    assert [chaos.wall(t) for t in (5, 10, 16, 25, 30)] == [5, 10, 12, 15, 20]
