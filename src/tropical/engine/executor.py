"""The model half of an engine worker: run a planned step's spans and sample its tokens."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from tropical.core.sampling import TokenLogprobs
from tropical.engine.batch import FlatBatch
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.model import LlamaModel
from tropical.engine.sampling import position_logprobs, sample_rows
from tropical.sched.step import PromptRow, StepOutput, StepSpec


class Executor:
    """A model and its paged KV cache; knows nothing of queues or requests."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache) -> None:
        self.model = model
        self.cache = cache

    def run(self, spec: StepSpec) -> StepOutput:
        """One forward pass over ``spec.spans``; the sampled token of every row in ``spec.samples``
        (with logprobs where a row asks), and the logprobs of ``spec.prompts``' targets."""
        batch = FlatBatch.build(spec.spans, self.cache)
        row_of = {span.seq_id: i for i, span in enumerate(spec.spans)}
        scored = [range(batch.starts[row_of[p.seq_id]], batch.starts[row_of[p.seq_id]] + len(p.targets))
                  for p in spec.prompts]
        logits = self.model(batch, self.cache, [i for positions in scored for i in positions])
        for span in spec.spans:
            self.cache.store(span.seq_id, span.total, span.block_hashes)
        prompt_logprobs = self._prompt_logprobs(logits[len(spec.spans):], spec.prompts)
        if not spec.samples:
            return StepOutput({}, {}, prompt_logprobs)
        rows = [row_of[s.seq_id] for s in spec.samples]
        ids, logprobs = sample_rows(logits[rows], spec.samples)
        tokens = {s.seq_id: token for s, token in zip(spec.samples, ids, strict=True)}
        return StepOutput(tokens, logprobs, prompt_logprobs)

    @staticmethod
    def _prompt_logprobs(logits: torch.Tensor, prompts: list[PromptRow]) -> dict[int, list[TokenLogprobs]]:
        """Each prompt row's logprobs, from its positions' logits (stacked in row order)."""
        out, offset = {}, 0
        for row in prompts:
            end = offset + len(row.targets)
            out[row.seq_id] = position_logprobs(logits[offset:end], row.targets, row.top)
            offset = end
        return out

    def free(self, seq_ids: Iterable[int]) -> None:
        for seq_id in seq_ids:
            self.cache.free(seq_id)
