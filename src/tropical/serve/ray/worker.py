"""A worker as a Ray actor: the local worker's runtime, with KV handed over as numpy arrays.

Ray puts a returned numpy array into its node's shared-memory object store once; an importing
actor on the same node reads it there without a copy (read-only), and one on another node gets
it straight from that node, never through the router. bfloat16, which numpy lacks, travels as
its raw 16 bits. Commands (Step, Free, Profile) are the local worker's, run by the same runtime.
"""

from __future__ import annotations

import os
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from tropical.engine.kv_events import KVEvent
from tropical.serve.workers.messages import Ready, WorkerLaunch
from tropical.serve.workers.process import WorkerRuntime


@dataclass(frozen=True, slots=True)
class Location:
    """Where one incarnation of an actor runs; Ray's restart makes a new ``incarnation``."""

    pid: int
    node: str
    incarnation: str


class Restarted(RuntimeError):
    """A call meant for an incarnation of the actor that died reached the one Ray restarted."""


class RayWorker:
    """The actor's body; Ray calls its methods one at a time, in the order each caller sent them.

    Every command names the incarnation it is meant for: Ray delivers a call sent after a death
    to the restarted actor, whose cache is empty, while the router may still plan on the dead
    one's. Such a call fails (``Restarted``), and the router learns of the death from it."""

    def __init__(self, launch: WorkerLaunch) -> None:
        self.runtime = WorkerRuntime(launch)
        self.dtype = getattr(torch, launch.dtype)
        node = node_address(ray.get_runtime_context().get_node_id())
        self.location = Location(os.getpid(), node, uuid.uuid4().hex)

    def ready(self) -> Ready:
        return self.runtime.ready()

    def where(self) -> Location:
        """Also the watcher's ping: cheap, and it tells a restarted actor from the one we knew."""
        return self.location

    def handle(self, incarnation: str, command: Any) -> Any:
        self._addressed(incarnation)
        return self.runtime.handle(command)

    @ray.method(num_returns=2)
    def export_kv(self, incarnation: str, seq_id: int, tokens: int, start: int = 0
                  ) -> tuple[float, np.ndarray]:
        """Seconds taken, and the KV as an array (a separate object, so the router can wait for the
        first without fetching the second)."""
        self._addressed(incarnation)
        began = time.perf_counter()
        kv = self.runtime.export_kv(seq_id, tokens, start).cpu()
        array = (kv.view(torch.int16) if kv.dtype == torch.bfloat16 else kv).numpy()
        return time.perf_counter() - began, array

    def import_kv(self, incarnation: str, seq_id: int, kv: np.ndarray, start: int = 0,
                  block_hashes: tuple[int, ...] = ()) -> list[KVEvent]:
        self._addressed(incarnation)
        with warnings.catch_warnings():
            # The object store's memory is read-only; the import only reads it.
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            tensor = torch.from_numpy(kv)
        return self.runtime.import_kv(seq_id, tensor.view(self.dtype), start, block_hashes)

    def _addressed(self, incarnation: str) -> None:
        """Refuse a call meant for another incarnation of this actor (see the class)."""
        if incarnation != self.location.incarnation:
            raise Restarted(f"the actor was restarted: the call was meant for incarnation {incarnation}, "
                            f"this is {self.location.incarnation}")


def node_address(node_id: str) -> str:
    """The IP a Ray node registered with (what ``node:`` pins name), or its id if unknown."""
    return next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), node_id)


RemoteWorker = ray.remote(RayWorker)
