"""Start `tropical serve` on 127.0.0.1 in a subprocess for a test, and stop it by PID."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tropical.serve.process import ServerProcess

LiveServer = ServerProcess


def stop(server: ServerProcess) -> int:
    return server.stop(timeout=20)


@contextmanager
def live_server(tmp: Path, *args: str, model: str = "tiny-random", timeout: float = 120
                ) -> Iterator[ServerProcess]:
    """`tropical serve --model MODEL ARGS` on a free port, healthy before the body runs."""
    log = tmp / f"serve-{len(list(tmp.glob('serve-*.log')))}.log"
    server = ServerProcess.start(["--model", model, *args], log, timeout)
    try:
        yield server
    finally:
        server.stop(timeout=20)


def eventually(check: Callable[[], bool], timeout: float = 30) -> bool:
    """Poll ``check`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


async def until(check: Callable[[], bool], timeout: float = 30) -> bool:
    """``eventually`` inside an event loop: it polls without blocking the tasks it waits on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.01)
    return False
