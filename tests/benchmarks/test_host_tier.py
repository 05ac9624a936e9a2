"""benchmarks/host_tier.py: one cell's capacity, bound, hits and host loads, and bad sizes refused."""

from __future__ import annotations

import sys

import pytest

from tests.benchmarks.scripts import load
from tropical.config import SimConfig

H = load("host_tier")


def test_host_memory_adds_hits_loaded_from_it_under_the_same_bound() -> None:
    cfg = SimConfig(limit=300).with_preset()
    alone, tiered = H.cell(cfg, "kv-router", 0.0), H.cell(cfg, "kv-router", 10.0)
    shared = H.cell(cfg, "kv-router", 10.0, "shared")
    assert alone["bound_rps"] == tiered["bound_rps"] == shared["bound_rps"] and alone["capacity_rps"] > 0
    assert min(tiered["prefix_hit_rate"], shared["prefix_hit_rate"]) > alone["prefix_hit_rate"] > 0
    assert min(tiered["host_load_rate"], shared["host_load_rate"]) > 0 == alone["host_load_rate"]
    assert H.row("kv-router@0@per-worker", alone)[:3] == ["kv-router", "0", "-"]
    assert H.row("kv-router@10@shared", shared)[:3] == ["kv-router", "10", "shared"]


def test_a_negative_host_size_is_refused_by_name(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["host_tier.py", "--host-kv", "-1", "--limit", "10"])
    with pytest.raises(SystemExit):
        H.main()
    assert "--host-kv -1" in capsys.readouterr().err
