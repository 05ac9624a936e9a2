"""A server started through ServerProcess (as `tropical fidelity` starts its servers) does not
outlive the process that started it, even when that process is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.live_server import eventually

STARTER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tropical.serve.process import ServerProcess
    server = ServerProcess.start(["--model", "tiny-random"], Path(sys.argv[1]), timeout=120)
    print(server.pid, flush=True)
    time.sleep(600)
""")


def _gone(pid: int) -> bool:
    """Exited (reaped, or a zombie waiting for its new parent to reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_server_whose_starter_is_killed_stops(tmp_path: Path) -> None:
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path / "serve.log")],
                               stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        pid = int(starter.stdout.readline())
        assert not _gone(pid)
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=10)
        assert eventually(lambda: _gone(pid), timeout=60), (tmp_path / "serve.log").read_text()
    finally:
        starter.kill()
        if pid is not None and not _gone(pid):
            os.kill(pid, signal.SIGKILL)
