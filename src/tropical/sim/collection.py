"""Python's cyclic garbage collector held back during a simulation.

A simulation allocates millions of short-lived objects (batch shapes, plans, predictions) beside
a heap of long-lived ones that grows with the cluster (workers, their caches and queues, the
requests). The collector's default first-generation threshold (700 net allocations) runs a
collection every few decisions, and each older-generation one walks that whole heap: measured
side by side at 1,024 workers, that was 8-22% of the simulation's CPU time (27% under a burst
with Path 2's prices kept), against a few percent at 4. The simulator makes almost no reference
cycles, so collecting rarely costs no memory (peak RSS measured the same); reference counting
still frees everything else at once. A process that simulated once and is about to exit leaves
its heap to the operating system: the interpreter's last collection would otherwise walk and free
the whole simulated fleet, which at 1,024 workers is the graph of every worker's cache and queue.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager

RARELY = (50_000, 20, 100)
"""Net allocations before a first-generation collection, and first- and second-generation
collections before the next older one (Python's defaults: 700, 10, 10)."""


@contextmanager
def collected_rarely() -> Iterator[None]:
    """Run the body with the collector's thresholds at ``RARELY``, then put them back."""
    before = gc.get_threshold()
    gc.set_threshold(*RARELY)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def left_to_exit() -> None:
    """At this process's exit, exempt every object still alive from the last collection
    (``gc.freeze`` as an exit handler, which runs before it; registered once however often
    asked): exiting does not walk the heap a simulation built."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
