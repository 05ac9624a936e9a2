"""The routers (ours and vLLM's), the simulator's twin of a server run and the simulator itself
load no torch: they share sched's Cluster, which is pure (checked in a fresh interpreter, so
other tests' imports cannot hide a regression)."""

from __future__ import annotations

import subprocess
import sys


def test_router_twin_and_simulator_import_no_torch():
    code = ("import sys, tropical.serve.router, tropical.serve.vllm.driver, tropical.fidelity.twin, "
            "tropical.sim.simulator, tropical.sched.cluster; "
            "print(sorted(m for m in ('torch', 'tropical.engine.sampling') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
