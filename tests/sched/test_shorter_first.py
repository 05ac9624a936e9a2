"""``shorter_first``: an arriving prompt at risk on Path 1 takes Path 2 at once only where no
shorter prompt at risk waits in the prefill queues; else it queues there, and the rounds offer
Path 2 shortest first."""

from __future__ import annotations

from dataclasses import replace

from tropical.config import SimConfig
from tropical.core.request import PrefillPath
from tropical.sched.tropical import TropicalPolicy
from tropical.sim.build import experiment
from tropical.sim.run import simulate


def arrivals_past_shorter(monkeypatch, shorter_first: bool) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """On the preset cluster at the conversation trace's full rate (its first 800 requests):
    how many arrivals a shorter prompt at risk waited for were sent down Path 2 at once, and
    how many of them were queued on Path 1 instead."""
    taken, queued = 0, 0
    place = TropicalPolicy._place

    def watched(self, req, now, workers):  # type: ignore[no-untyped-def]
        nonlocal taken, queued
        self._split(workers)
        waiting = self._shorter_at_risk(req, now)
        moves = place(self, req, now, workers)
        if waiting:
            taken += moves[0].path is PrefillPath.MULTIPLEX
            queued += moves[0].path is PrefillPath.FALLBACK and "shorter prompt at risk" in moves[0].reason
        return moves

    monkeypatch.setattr(TropicalPolicy, "_place", watched)
    cfg = replace(SimConfig(limit=800).with_preset(), shorter_first=shorter_first)
    simulate(experiment(cfg).with_policy("tropical+"))
    return taken, queued


def test_an_arrival_waits_for_shorter_prompts_at_risk_only_when_asked(monkeypatch) -> None:
    taken, queued = arrivals_past_shorter(monkeypatch, shorter_first=True)
    assert taken == 0 and queued >= 5
    taken, _ = arrivals_past_shorter(monkeypatch, shorter_first=False)
    assert taken >= 5
