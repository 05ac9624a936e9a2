"""Opt-in CPU workaround for NIXL inside vLLM processes (`tropical serve --engine vllm
--nixl-poll-delay-us N`): started only on CPU, through PYTHONPATH, never in a GPU path.

nixl's Python API hard-codes ``pthrDelay = 0`` for its progress thread, which then polls UCX with
zero timeouts and keeps a whole core busy while idle (measured: ~0.9 of a core per vLLM instance,
on the core the instance computes on). vLLM exposes no setting for it, so this patch sets the
delay to ``TROPICAL_NIXL_POLL_DELAY_US`` microseconds when nixl's API module is imported: the
thread still progresses transfers, but sleeps between polls.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

MODULES = ("nixl_cu12._api", "nixl_cu13._api", "nixl._api")
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


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch nixl's API module right after it loads, whoever imports it first."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            module.nixlBind = _DelayedAgent(module.nixlBind)  # type: ignore[attr-defined]  # nixl's binding

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # wraps nixl's loader
        return spec


if DELAY_US > 0:
    sys.meta_path.insert(0, _PatchOnImport())
