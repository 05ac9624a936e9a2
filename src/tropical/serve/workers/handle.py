"""What the router needs of a worker, whatever runs it: a local process or a Ray actor; and
what start-up needs of the backend that runs them.

The policy sees WorkerStates only; the router talks to workers through this interface, so the
backends differ in transport (a pipe and mapped files, or actor calls and the object store) and
in nothing the scheduler can observe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from tropical.engine.kv_events import KVEvent
from tropical.serve.workers.messages import Ready, WorkerLaunch
from tropical.serve.workers.placement import Placement


class WorkerDied(RuntimeError):
    """The worker is gone; every command in flight fails with this."""


class WorkerError(RuntimeError):
    """The worker could not carry out a command (it lives on)."""


class WorkerHandle(Protocol):
    worker_id: int
    alive: bool
    on_death: Callable[[int], None]
    """Called once, on the event loop, when the worker is found dead."""
    on_revive: Callable[[int], None]
    """Called on the event loop when a dead worker serves again, restarted with an empty KV cache
    (backends that restart workers; the local one never does)."""

    @property
    def pid(self) -> int | None: ...

    @property
    def node(self) -> str:
        """Where the worker runs ("local", or a Ray node address)."""
        ...

    async def ready(self, timeout: float) -> Ready:
        """Wait until the worker has loaded its model; raises WorkerError if it cannot start."""
        ...

    async def call(self, command: Any) -> Any:
        """Run one command (messages.Step, Free, Profile) and return its reply's value."""
        ...

    def exported(self, seq_id: int, tokens: int, start: int = 0) -> AbstractAsyncContextManager[Any]:
        """Export ``tokens`` tokens of a sequence's KV from its token ``start`` on (those the target
        lacks); the value is what ``import_kv`` of another worker takes, valid until the context
        exits."""
        ...

    async def import_kv(self, seq_id: int, blob: Any, tokens: int, start: int = 0,
                        block_hashes: tuple[int, ...] = ()) -> list[KVEvent]:
        """Write an exported KV blob into ``seq_id``'s blocks from its token ``start`` on, after
        this worker's cached run of ``block_hashes``; returns the KV events of the import (the
        blocks it stored, and those it evicted to make room)."""
        ...

    def stop(self) -> None:
        """End the worker and release what it holds."""
        ...


class Backend(Protocol):
    """What starts the workers: local processes, or Ray actors on a cluster."""

    def spawn(self, launches: Sequence[WorkerLaunch], placements: Sequence[Placement]) -> list[WorkerHandle]:
        """Start one worker per launch (placed as pinned) and return their handles, not yet ready."""
        ...

    def close(self) -> None:
        """Release what the backend holds once every worker has stopped."""
        ...
