"""Start `tropical serve --engine mock`: the own-engine start-up (workers ready, priced, routed),
with mock workers from a backend that spawns them on the router's loop, priced by the latency
model they sleep, so the router's predictions are exact and only its own overheads show."""

from __future__ import annotations

from collections.abc import Sequence

from tropical.core.latency.model import LatencyModel
from tropical.serve.metrics import ServerMetrics
from tropical.serve.mock.model import MockModel, mock_model
from tropical.serve.mock.worker import MockWorker
from tropical.serve.options import ServeOptions
from tropical.serve.workers.handle import WorkerHandle
from tropical.serve.workers.launch import Cluster, launch_on
from tropical.serve.workers.messages import Ready, WorkerLaunch
from tropical.serve.workers.placement import Placement


class MockBackend:
    """Spawns mock workers of one model; they hold nothing to release."""

    def __init__(self, model: MockModel) -> None:
        self.model = model

    def spawn(self, launches: Sequence[WorkerLaunch], placements: Sequence[Placement]) -> list[WorkerHandle]:
        return [MockWorker(launch.worker_id, self.model) for launch in launches]

    def close(self) -> None:
        pass


async def launch_mock(options: ServeOptions, metrics: ServerMetrics) -> Cluster:
    """Mock workers of the ``--mock-cluster`` model, routed as our engine's workers are."""
    model = mock_model(options)

    async def price(client: WorkerHandle, ready: Ready) -> tuple[LatencyModel, str]:
        return model.latency, model.note

    return await launch_on(options, metrics, lambda _: MockBackend(model), price)
