"""The chaos soak in small (benchmarks/soak.py): a minute of a live Ray-backed server with one worker
SIGKILLed and one burst; every request sent is answered, none hangs, the killed worker comes back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
