"""The Ray backend: each worker a Ray actor, placed by the resources it asks for and restarted by
Ray when it dies; the router drives them through RayWorkerHandles.

Without ``--ray-address`` a private Ray instance starts on this machine and stops with the
server; with one, the server joins that cluster as a driver and leaves it running.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import ray
from ray.actor import ActorHandle

from tropical.serve.options import ServeOptions
from tropical.serve.ray.handle import RayWorkerHandle
from tropical.serve.ray.worker import RemoteWorker
from tropical.serve.workers.handle import WorkerHandle
from tropical.serve.workers.messages import WorkerLaunch
from tropical.serve.workers.placement import Placement, check_fits


@dataclass(frozen=True)
class RayBackend:
    """How each actor is sized: CPUs (its torch threads), GPUs by default, restarts allowed."""

    cpus: int
    gpus: float
    max_restarts: int

    @classmethod
    def connect(cls, options: ServeOptions, workers: int) -> RayBackend:
        """Join the cluster at ``--ray-address``, or start a local instance sized for ``workers``."""
        uvicorn_handler = signal.getsignal(signal.SIGTERM)
        if options.ray_address is None:
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, workers * options.threads),
                     include_dashboard=False, logging_level=logging.WARNING)
        else:
            ray.init(address=options.ray_address, logging_level=logging.WARNING)
        if uvicorn_handler is not None:
            # ray.init makes SIGTERM exit at once; the server's own handler drains first.
            signal.signal(signal.SIGTERM, uvicorn_handler)
        gpus = 1.0 if options.device.startswith("cuda") else 0.0
        return cls(options.threads, gpus, options.ray_max_restarts)

    def spawn(self, launches: Sequence[WorkerLaunch], placements: Sequence[Placement]
              ) -> list[WorkerHandle]:
        """Check that every worker fits some node, then create the actors (not yet ready)."""
        nodes = ray.nodes()
        demands = [p.demand(self.cpus, self.gpus) for p in placements]
        for launch, demand in zip(launches, demands, strict=True):
            check_fits(launch.worker_id, demand, nodes)
        return [RayWorkerHandle(self._actor(launch, demand), launch.worker_id)
                for launch, demand in zip(launches, demands, strict=True)]

    def _actor(self, launch: WorkerLaunch, demand: dict[str, float]) -> ActorHandle:
        """A new actor; Ray types ``remote()`` as the handle or the class itself (so that method
        calls type-check either way), but what it returns is the handle."""
        custom = {k: v for k, v in demand.items() if k not in ("CPU", "GPU")}
        actor_class = RemoteWorker.options(num_cpus=demand.get("CPU", 0), num_gpus=demand.get("GPU", 0),
                                           resources=custom, max_restarts=self.max_restarts)
        return cast(ActorHandle, actor_class.remote(launch))

    def close(self) -> None:
        """Disconnect; a Ray instance this server started stops with it."""
        ray.shutdown()
