"""Start `tropical serve` on 127.0.0.1 in a subprocess for a test, and stop it by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

TROPICAL = str(Path(sys.executable).parent / "tropical")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    """A running server: its URL, process and captured output."""

    url: str
    process: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=5).json()

    def output(self) -> str:
        return self.log.read_text()


def _wait_healthy(server: LiveServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.output()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"server not healthy within {timeout}s:\n{server.output()}")


def stop(server: LiveServer, timeout: float = 20) -> int:
    """SIGTERM (drain), then SIGKILL if it lingers; returns the exit code."""
    if server.process.poll() is None:
        os.kill(server.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, signal.SIGKILL)
            server.process.wait(timeout)
    return server.process.returncode


@contextmanager
def live_server(tmp: Path, *args: str, model: str = "tiny-random", timeout: float = 120
                ) -> Iterator[LiveServer]:
    """`tropical serve --model MODEL ARGS` on a free port, healthy before the body runs."""
    port = free_port()
    log = tmp / f"serve-{port}.log"
    with log.open("w") as out:
        process = subprocess.Popen([TROPICAL, "serve", "--model", model, "--port", str(port), *args],
                                   stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
    server = LiveServer(f"http://127.0.0.1:{port}", process, log)
    try:
        _wait_healthy(server, timeout)
        yield server
    finally:
        stop(server)
