"""A Ray worker handle against a real actor that Ray restarts: calls reach only the incarnation
the router knows."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterator

import pytest
import ray
from ray.exceptions import RayError

from tropical.serve.ray import handle as handle_module
from tropical.serve.ray.handle import RayWorkerHandle
from tropical.serve.ray.worker import Location, RemoteWorker
from tropical.serve.workers.handle import WorkerDied
from tropical.serve.workers.messages import Free, WorkerLaunch

LAUNCH = WorkerLaunch(0, "tiny-random", "float32", "cpu", 1, 256, 16, 256)


@pytest.fixture
def private_ray() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()


async def _restarted(actor: ray.actor.ActorHandle, old: Location) -> Location:
    """Wait, asking the actor itself (not through the handle), until Ray has restarted it."""
    while True:
        try:
            where = await actor.where.remote()
        except RayError:
            where = old
        if where != old:
            return where
        await asyncio.sleep(0.1)


def test_a_call_sent_after_a_death_fails_instead_of_reaching_the_restarted_actor(
        private_ray: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The restart has an empty cache while the router may still plan on the dead actor's: the
    call must fail as a death (whose handling reruns or ends its requests), not run there."""
    monkeypatch.setattr(handle_module, "PING_INTERVAL_S", 3600.0)  # only the call can notice

    async def scenario() -> None:
        actor = RemoteWorker.options(num_cpus=1, max_restarts=1).remote(LAUNCH)
        handle = RayWorkerHandle(actor, 0)
        deaths: list[int] = []
        handle.on_death = deaths.append
        await handle.ready(120)
        old = handle.location
        assert old is not None and await handle.call(Free([])) is None
        os.kill(old.pid, signal.SIGKILL)
        await asyncio.wait_for(_restarted(actor, old), 120)
        with pytest.raises(WorkerDied, match="restarted"):
            await handle.call(Free([]))
        assert deaths == [0] and not handle.alive
        handle.stop()

    asyncio.run(scenario())
