"""Start a cluster: workers up and loaded, a latency profile, the router driving them.

The workers are local processes or Ray actors (``--backend``); either way the router gets
WorkerHandles and cannot tell which. The profile prices the toggle's predictions. Without
``--profile`` the first worker measures one quickly (seconds) and the result is cached per model,
dtype, device and thread count, so later starts reuse it; the returned note says which happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tropical.config import slo_spec
from tropical.core.latency.fitted import FittedModel
from tropical.core.latency.model import LatencyModel
from tropical.sched.fleet import worker_states
from tropical.serve.iteration_log import IterationLog
from tropical.serve.metrics import ServerMetrics
from tropical.serve.options import ServeOptions, placements, policy_and_roles
from tropical.serve.profiles import ProfileSource, choose_profile
from tropical.serve.router import Router, RouterSettings
from tropical.serve.workers.client import LocalBackend
from tropical.serve.workers.handle import Backend, WorkerHandle
from tropical.serve.workers.messages import Profile, Ready, WorkerLaunch


@dataclass
class Cluster:
    """A started cluster; ``stop`` ends the workers, then lets the backend release what it holds."""

    router: Router
    clients: list[WorkerHandle]
    backend: Backend
    profile_note: str
    model_name: str
    max_model_len: int

    async def stop(self) -> None:
        await self.router.stop()
        for client in self.clients:
            client.stop()
        self.backend.close()
        if self.router.iteration_log is not None:
            self.router.iteration_log.close()


Price = Callable[[WorkerHandle, Ready], Awaitable[tuple[LatencyModel, str]]]
"""The latency model that prices the policy, given the first started worker, and a note saying
where it came from."""


async def launch(options: ServeOptions, metrics: ServerMetrics) -> Cluster:
    """Our engine's workers, priced by a profile: given, cached, or measured on the first worker."""

    async def price(client: WorkerHandle, ready: Ready) -> tuple[LatencyModel, str]:
        return await choose_profile(options.profile, _profile_source(options, client, ready))

    return await launch_on(options, metrics, lambda workers: open_backend(options, workers), price)


async def launch_on(options: ServeOptions, metrics: ServerMetrics, open_: Callable[[int], Backend],
                    price: Price) -> Cluster:
    """Start the workers on the backend ``open_`` opens for their count, wait until every one is
    ready, ``price`` them, start routing."""
    policy, roles = policy_and_roles(options)
    backend = open_(len(roles))
    clients: list[WorkerHandle] = []
    try:
        clients = backend.spawn([_launch_spec(options, i) for i in range(len(roles))],
                                placements(options, roles))
        readies = await asyncio.gather(*(c.ready(options.start_timeout) for c in clients))
        latency, note = await price(clients[0], readies[0])
    except BaseException:
        for client in clients:
            client.stop()
        backend.close()
        raise
    workers = worker_states(policy, roles, [(r.num_blocks, r.block_size) for r in readies],
                            [latency] * len(roles), options.prefix_cache)
    max_len = min(r.max_model_len for r in readies)
    settings = RouterSettings(options.max_waiting, slo_spec(options), max_len)
    log = IterationLog(options.iteration_log) if options.iteration_log else None
    router = Router(policy, workers, clients, readies[0].tokenizer, latency, settings, metrics,
                    iteration_log=log)
    router.start()
    name = options.served_model_name or readies[0].model_name
    return Cluster(router, clients, backend, note, name, max_len)


def open_backend(options: ServeOptions, workers: int) -> Backend:
    """Local processes, or a Ray cluster joined (``--ray-address``) or started here."""
    if options.backend == "local":
        return LocalBackend()
    from tropical.serve.ray.backend import RayBackend  # Ray is an optional dependency

    return RayBackend.connect(options, workers)


def _launch_spec(options: ServeOptions, worker_id: int) -> WorkerLaunch:
    return WorkerLaunch(worker_id, options.model, options.dtype, options.device, options.threads,
                        options.kv_tokens, options.block_size, options.max_model_len)


def _profile_source(options: ServeOptions, client: WorkerHandle, ready: Ready) -> ProfileSource:
    """Our engine's profile: cached per model, dtype, device and thread count; measured quickly
    (seconds) by the first worker."""

    async def measure() -> tuple[FittedModel, dict[str, Any]]:
        document = await client.call(Profile("quick"))
        return FittedModel.from_dict(document), document

    return ProfileSource(f"{ready.model_name}-{options.dtype}-{options.device}-t{options.threads}.json",
                         measure, "latency profile", "worker 0 quickly")
