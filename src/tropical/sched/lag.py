"""How a substrate that books decode iterations lazily keeps its workers' states exact when read.

The simulator prices a run of decode iterations in closed form and books it at the run's end. A
decision that reads a worker in the middle of such a run must see the iterations completed by
then; booking every run before every decision costs each event the whole fleet. Instead a worker
with a ``Lag`` asks its substrate to book what it has run (``catch_up``) when something reads its
decode progress, and a walk by load reads lower bounds first (``WorkerState.load_floor``) and the
exact load of the workers it reaches without booking anything, so an event books only the workers
whose iterations a decision prices. The substrate announces each run as it starts, with the
least its iterations take (``Cluster.expect_end``'s ``pace``, positive); an iteration's booking
ends it (``pace`` 0), and a worker with no run in flight asks nothing. Substrates that book
every iteration as it ends (our engine, vLLM mirrors) have no lag: their states are exact
whenever read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class Lag:
    """The substrate's clock (``now``), how many decode iterations a worker has completed by
    then beyond those booked (``unbooked(worker_id)``: enough for its exact load, which every
    walk by load reads), and how it books them (``catch_up(worker_id)``: for everything else)."""

    catch_up: Callable[[int], None]
    unbooked: Callable[[int], int]
    now: float = 0.0
