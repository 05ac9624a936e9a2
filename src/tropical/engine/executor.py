"""The model half of an engine worker: run a planned step's spans and sample its tokens."""

from __future__ import annotations

from collections.abc import Iterable

from tropical.engine.batch import FlatBatch
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.model import LlamaModel
from tropical.engine.sampling import sample, step_generator
from tropical.sched.step import StepSpec


class Executor:
    """A model and its paged KV cache; knows nothing of queues or requests."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache) -> None:
        self.model = model
        self.cache = cache

    def run(self, spec: StepSpec) -> dict[int, int]:
        """One forward pass over ``spec.spans``; the sampled token of every row in ``spec.samples``."""
        logits = self.model(FlatBatch.build(spec.spans, self.cache), self.cache)
        for span in spec.spans:
            self.cache.store(span.seq_id, span.total, span.block_hashes)
        if not spec.samples:
            return {}
        row_of = {span.seq_id: i for i, span in enumerate(spec.spans)}
        rows = [row_of[s.seq_id] for s in spec.samples]
        generators = [step_generator(s.params, s.step, self.cache.device) for s in spec.samples]
        ids = sample(logits[rows], [s.params for s in spec.samples], generators)
        return {s.seq_id: token for s, token in zip(spec.samples, ids, strict=True)}

    def free(self, seq_ids: Iterable[int]) -> None:
        for seq_id in seq_ids:
            self.cache.free(seq_id)
