"""The collector's thresholds during a simulation, and after it."""

from __future__ import annotations

import gc

import pytest

from tropical.sim.collection import RARELY, collected_rarely


def test_the_thresholds_are_raised_inside_and_restored_after_even_on_error() -> None:
    before = gc.get_threshold()
    with collected_rarely():
        assert gc.get_threshold() == RARELY
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), collected_rarely():
        raise RuntimeError("a failed run")
    assert gc.get_threshold() == before
