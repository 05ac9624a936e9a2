"""What a latency model sees of one iteration: aggregate sums, never per-request lists.

A batch is a set of spans (new tokens, tokens already cached). A decode is the span (1, context).
Keeping only sums lets the simulator price an iteration in O(1) whatever the batch size, and the
engine's profiler fit exactly the quantities the simulator asks about.
"""

from __future__ import annotations

from dataclasses import dataclass


def attention_pairs(new: int, cached: int) -> int:
    """Causal query-key pairs of a prefill span: token i of the span sees cached + i + 1 keys."""
    return new * cached + new * (new + 1) // 2


@dataclass(slots=True)
class BatchShape:
    """Sums over one iteration's spans.

    prefill_*: spans with more than one new token or no cached context (prefills and chunks);
    decode_*: one new token over ``context`` cached tokens each.

    A value: never change one (shapes are shared and hashed). The schedulers build about a
    million per simulated run, so it is not frozen (a frozen one costs three times as much to
    build) and it writes its own constructor and ``__hash__`` (it hashes as a frozen one
    would): mypyc compiles those, where it leaves the ones ``dataclass`` generates interpreted
    (README, Performance, measures the difference). The other values built per iteration or per
    candidate write their constructors for the same reason. Its class methods build with
    ``BatchShape(...)``, not ``cls(...)``: compiled, a call through ``cls`` is a generic one that
    parses its arguments as the interpreter does (several times the shape's own cost).
    """

    prefill_tokens: int = 0
    prefill_pairs: int = 0
    prefill_cached: int = 0
    num_prefills: int = 0
    decode_count: int = 0
    decode_context: int = 0

    def __init__(self, prefill_tokens: int = 0, prefill_pairs: int = 0, prefill_cached: int = 0,
                 num_prefills: int = 0, decode_count: int = 0, decode_context: int = 0) -> None:
        self.prefill_tokens = prefill_tokens
        self.prefill_pairs = prefill_pairs
        self.prefill_cached = prefill_cached
        self.num_prefills = num_prefills
        self.decode_count = decode_count
        self.decode_context = decode_context

    def __hash__(self) -> int:
        return hash((self.prefill_tokens, self.prefill_pairs, self.prefill_cached, self.num_prefills,
                     self.decode_count, self.decode_context))

    @classmethod
    def of_spans(cls, prefills: list[tuple[int, int]], decode_contexts: list[int]) -> BatchShape:
        """Build from explicit spans (new tokens, cached tokens) and decode contexts."""
        return cls.of_batch(prefills, len(decode_contexts), sum(decode_contexts))

    @classmethod
    def of_batch(cls, prefills: list[tuple[int, int]], decode_count: int,
                 decode_context: int) -> BatchShape:
        """Prefill spans (new, cached) plus decodes already summed (the schedulers keep sums).
        One pass over the spans: this runs for every batch formed and every candidate priced."""
        tokens = pairs = cached_sum = 0
        for new, cached in prefills:
            tokens += new
            pairs += attention_pairs(new, cached)
            cached_sum += cached
        return BatchShape(tokens, pairs, cached_sum, len(prefills), decode_count, decode_context)

    @classmethod
    def prefill(cls, new: int, cached: int = 0) -> BatchShape:
        return BatchShape(new, attention_pairs(new, cached), cached, 1, 0, 0)

    @classmethod
    def decode(cls, batch: int, total_context: int) -> BatchShape:
        return BatchShape(0, 0, 0, 0, batch, total_context)

    def plus_prefill(self, new: int, cached: int) -> BatchShape:
        """This batch with one more prefill span."""
        return BatchShape(self.prefill_tokens + new, self.prefill_pairs + attention_pairs(new, cached),
                          self.prefill_cached + cached, self.num_prefills + 1, self.decode_count,
                          self.decode_context)

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_count

    @property
    def is_empty(self) -> bool:
        return self.tokens == 0
