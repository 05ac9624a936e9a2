"""The worker process's runtime: what it tells the router besides a step's tokens."""

from __future__ import annotations

import torch

from tropical.engine.kv_events import replay
from tropical.serve.workers.messages import WorkerLaunch
from tropical.serve.workers.process import WorkerRuntime


def test_an_import_reports_the_cached_blocks_it_evicted_to_make_room() -> None:
    """The router plans the worker's next step right after an import, so the import's own KV
    events must reach it then, not with the next step's."""
    runtime = WorkerRuntime(WorkerLaunch(0, "tiny-random", "float32", "cpu", 1, 64, 16, 256))
    cache, config = runtime.executor.cache, runtime.loaded.config
    old, new = (11, 12, 13), (21, 22, 23)
    cache.begin("a", old, 0)
    cache.ensure("a", 48)
    cache.store("a", 48, old)
    cache.free("a")
    cache.take_events()
    kv = torch.zeros(config.num_hidden_layers, 2, 48, config.num_key_value_heads, config.head_dim)
    events = runtime.import_kv(1, kv, 0, new)
    assert replay(events, old) == cache.cached_hashes == {11, *new}, "four blocks: two old ones made room"
    assert cache.take_events() == [], "the import's events went to the router with its reply"
