"""The collector's thresholds during a simulation, and after it; the heap left at exit."""

from __future__ import annotations

import gc
import subprocess
import sys

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


@pytest.mark.parametrize("asked", [0, 2])
def test_the_heap_is_frozen_at_exit_when_asked(asked: int) -> None:
    """An exit handler registered first runs last: it sees what the exit left frozen."""
    code = ("import atexit, gc; atexit.register(lambda: print(gc.get_freeze_count()))\n"
            "from tropical.sim.collection import left_to_exit\n" + "left_to_exit()\n" * asked)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert (int(out) > 0) == bool(asked)
