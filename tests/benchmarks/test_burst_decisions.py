"""The burst benchmark times arrivals and iteration ends apart, and hashes the same decisions alike."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.benchmarks.scripts import BENCHMARKS


def test_two_trees_of_the_same_sources_decide_alike_and_each_kind_is_timed() -> None:
    src = str(BENCHMARKS.parent / "src")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "burst_decisions.py"), "--workers", "8",
                           "--limit", "60", "--repeats", "1", "--policies", "tropical+",
                           "--tree", f"a={src}", "--tree", f"b={src}", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)
    assert [r["tree"] for r in runs] == ["a", "b"]
    assert runs[0]["requests"] == runs[1]["requests"]
    for run in runs:
        assert run["arrivals_us"] is not None and run["ends_us"] is not None
        assert 0 < run["all_us"][0] <= run["all_us"][1]
