"""Run `tropical serve` as a child process: start it on a free local port, wait until healthy,
stop it by PID (SIGTERM drains, SIGKILL if it lingers). Used by `tropical fidelity` and tests; the
server gets SIGTERM if its starter dies first, so a killed study leaves no server behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from tropical.serve.parent_death import terminate_with_parent

TROPICAL = str(Path(sys.executable).parent / "tropical")


def wait_healthy(url: str, process: subprocess.Popen, output: Callable[[], str], name: str,
                 timeout: float) -> None:
    """Return once ``url``/health answers 200; raise (with ``output``, the server's log) if
    ``process`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{output()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{name} not healthy within {timeout:.0f}s:\n{output()}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    """A running server: its URL, process and the file its output goes to."""

    url: str
    process: subprocess.Popen
    log: Path

    @classmethod
    def start(cls, args: list[str], log: Path, timeout: float = 300.0) -> ServerProcess:
        """`tropical serve ARGS --port P` on 127.0.0.1; returns once /health says ok."""
        port = free_port()
        with log.open("w") as out:
            process = subprocess.Popen([TROPICAL, "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
                                       stdout=out, stderr=subprocess.STDOUT,
                                       preexec_fn=terminate_with_parent())
        server = cls(f"http://127.0.0.1:{port}", process, log)
        try:
            server.wait_healthy(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text()

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=5).json()

    def wait_healthy(self, timeout: float) -> None:
        wait_healthy(self.url, self.process, self.output, "tropical serve", timeout)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (drain), then SIGKILL if it lingers; returns the exit code."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait(timeout)
        return self.process.returncode
