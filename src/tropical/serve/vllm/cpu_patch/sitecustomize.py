"""CPU workarounds for NIXL inside vLLM processes, put on their PYTHONPATH by ``serve.vllm.process``
when an instance has a KV connector (and by ``benchmarks/vllm_policies.sh``); never in a GPU path.

1. Each instance's cores (always on). On CPU, vLLM's NIXL connector worker "reserves" the last core
   of each NUMA node for KV transfers with ``os.sched_setaffinity(0, ...)``, in its constructor,
   which runs on the worker's main thread: the thread that runs the model (OpenMP thread 0). So
   every instance's model ends up on that one core whatever ``VLLM_CPU_OMP_THREADS_BIND`` said
   (measured: two SmolLM2 instances on a 2-core machine, both computing on core 1, core 0 idle;
   one instance made no progress for 10-20 s while the other prefilled). This patch gives the
   thread back the cores it had before the constructor.
2. NIXL's poll delay (opt-in, ``--nixl-poll-delay-us N``). nixl's Python API hard-codes
   ``pthrDelay = 0`` for its progress thread, which then polls UCX with zero timeouts and keeps a
   whole core busy while idle (measured: ~0.9 of a core per vLLM instance, on the core the
   instance computes on). vLLM exposes no setting for it, so this patch sets the delay to
   ``TROPICAL_NIXL_POLL_DELAY_US`` microseconds when nixl's API module is imported: the thread
   still progresses transfers, but sleeps between polls.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

NIXL_APIS = ("nixl_cu12._api", "nixl_cu13._api", "nixl._api")
NIXL_WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
DELAY_US = int(os.environ.get("TROPICAL_NIXL_POLL_DELAY_US", "0"))


class _DelayedAgent:
    """Stands in for the binding module inside nixl's API: agents get the poll delay."""

    def __init__(self, binding: ModuleType) -> None:
        self._binding = binding

    def __getattr__(self, name: str) -> Any:
        return getattr(self._binding, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # noqa: N802 - the binding's name
        config.pthrDelay = DELAY_US
        return self._binding.nixlAgent(name, config)


def delay_agents(module: ModuleType) -> None:
    module.nixlBind = _DelayedAgent(module.nixlBind)  # type: ignore[attr-defined]  # nixl's binding


def keep_cores(module: ModuleType) -> None:
    """The NIXL connector worker's constructor leaves the calling thread on the cores it had."""
    worker = module.NixlBaseConnectorWorker
    construct = worker.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        cores = os.sched_getaffinity(0)
        construct(self, *args, **kwargs)
        os.sched_setaffinity(0, cores)

    worker.__init__ = __init__


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch a module right after it loads, whoever imports it first."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # wraps the module's loader
        return spec


PATCHES: dict[str, Callable[[ModuleType], None]] = {NIXL_WORKER: keep_cores}
if DELAY_US > 0:
    PATCHES |= dict.fromkeys(NIXL_APIS, delay_agents)
sys.meta_path.insert(0, _PatchOnImport(PATCHES))
