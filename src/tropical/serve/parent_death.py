"""Children that do not outlive their parent: a server started by `tropical fidelity`, a test or
the router gets SIGTERM (and drains) when the process that started it dies, even by SIGKILL."""

from __future__ import annotations

import ctypes
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _terminate_with_parent() -> None:
    """In the child before exec: ask Linux for SIGTERM when the parent process exits."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def terminate_with_parent() -> Callable[[], None] | None:
    """The ``preexec_fn`` for such a child; None where the kernel has no parent-death signal."""
    return _terminate_with_parent if sys.platform.startswith("linux") else None
