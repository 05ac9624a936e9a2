"""Python's cyclic garbage collector held off during a simulation.

A simulation allocates millions of short-lived objects (batch shapes, plans, predictions) beside
a heap of long-lived ones that grows with the cluster (workers, their caches and queues, the
requests). The collector's default first-generation threshold (700 net allocations) runs a
collection every few decisions, and each older-generation one walks that whole heap: measured
side by side at 1,024 workers, that was 8-22% of the simulation's CPU time (27% under a burst
with Path 2's prices kept), against a few percent at 4. Raising the thresholds left each object
that outlives a first-generation collection walked once more (6% of the CPU time at 256
workers); holding the collector off altogether took 5% off that (median of five runs each,
side by side), with the same peak RSS at 4, 256 and 1,024 workers. The simulator makes almost no
reference cycles; reference counting still frees everything else at once, and the collector
runs again as soon as the simulation ends. A process that simulated once and is about to exit
leaves its heap to the operating system: the interpreter's last collection would otherwise walk
and free the whole simulated fleet, which at 1,024 workers is the graph of every worker's cache
and queue.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collection_held() -> Iterator[None]:
    """Run the body with the collector off, then as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def left_to_exit() -> None:
    """At this process's exit, exempt every object still alive from the last collection
    (``gc.freeze`` as an exit handler, which runs before it; registered once however often
    asked): exiting does not walk the heap a simulation built."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
