"""The collector during a simulation, and after it; the heap left at exit."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from tropical.sim.collection import collection_held


def test_the_collector_is_off_inside_and_as_it_was_after_even_on_error() -> None:
    assert gc.isenabled()
    with collection_held():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collection_held():
        raise RuntimeError("a failed run")
    assert gc.isenabled()
    gc.disable()
    try:
        with collection_held():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("asked", [0, 2])
def test_the_heap_is_frozen_at_exit_when_asked(asked: int) -> None:
    """An exit handler registered first runs last: it sees what the exit left frozen."""
    code = ("import atexit, gc; atexit.register(lambda: print(gc.get_freeze_count()))\n"
            "from tropical.sim.collection import left_to_exit\n" + "left_to_exit()\n" * asked)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert (int(out) > 0) == bool(asked)
