"""One iteration as an executor runs it: spans of new tokens and the rows to sample.

Built from sched's batch and each request's tokens, and model-free, so the router plans a worker
process's steps without torch, and a single engine worker plans its own the same way.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tropical.core.request import Request
from tropical.core.sampling import SamplingParams
from tropical.sched.batching import Batch


@dataclass(frozen=True, slots=True)
class Span:
    """New tokens of one sequence, placed after `cached` tokens already in the cache; a prompt's
    span names its full blocks (`block_hashes`, its request's ``prefix``) so that the engine's
    prefix cache can find and keep them."""

    seq_id: Hashable
    token_ids: list[int]
    cached: int
    block_hashes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError(f"span of sequence {self.seq_id!r} has no new tokens")
        if self.cached < 0:
            raise ValueError(f"span of sequence {self.seq_id!r} has negative cached count {self.cached}")

    @property
    def total(self) -> int:
        return self.cached + len(self.token_ids)


class TokenConstraint(Protocol):
    """A grammar a request's output must follow (structured outputs), one matcher per run of the
    request: it says which tokens may come next and follows each token sampled."""

    def allowed(self) -> bytes:
        """The tokens allowed next as a bitmask: little-endian 32-bit words, bit ``i % 32`` of word
        ``i // 32`` set when token ``i`` is allowed (llguidance's layout)."""
        ...

    def accept(self, token: int) -> None:
        """Follow ``token``, just sampled."""
        ...


@dataclass(slots=True)
class TokenSequence:
    """A request's tokens and sampling settings; ``output`` holds every token sampled so far."""

    req: Request
    prompt: list[int]
    params: SamplingParams
    ignore_eos: bool = False
    output: list[int] = field(default_factory=list)
    constraint: TokenConstraint | None = None

    def __post_init__(self) -> None:
        if len(self.prompt) != self.req.prompt_len:
            raise ValueError(f"request {self.req.id}: {len(self.prompt)} prompt ids, "
                             f"prompt_len {self.req.prompt_len}")

    @property
    def cached(self) -> int:
        """Tokens whose KV is in the cache once the prompt is done: all but the last sampled one."""
        return self.req.prompt_len + len(self.output) - 1

    def ends_at(self, token: int, eos_ids: frozenset[int]) -> bool:
        """True when ``token`` is an end-of-sequence token this request stops at."""
        return token in eos_ids and not self.ignore_eos


@dataclass(frozen=True, slots=True)
class SampleRow:
    """Sample the next token of ``seq_id`` from its span's logits; ``step`` seeds the draw."""

    seq_id: int
    params: SamplingParams
    step: int


@dataclass(frozen=True, slots=True)
class StepSpec:
    """What an executor runs: one forward over ``spans``, then a token for each of ``samples``
    (in span order; a prompt chunk that does not end its prompt samples nothing)."""

    spans: list[Span]
    samples: list[SampleRow]


def step_spec(batch: Batch, decoding: Iterable[int], sequences: Mapping[int, TokenSequence]) -> StepSpec:
    """The executor's view of ``batch``: one span per decoding request (ids in batch order), then
    the prompt spans; a prompt that ends in this step samples its first token."""
    seqs = [sequences[rid] for rid in decoding] if batch.decode_count else []
    spans = [Span(s.req.id, [s.output[-1]], s.cached) for s in seqs]
    samples = [SampleRow(s.req.id, s.params, len(s.output)) for s in seqs]
    for req, new, cached in batch.prefills:
        seq = sequences[req.id]
        spans.append(Span(req.id, seq.prompt[cached:cached + new], cached, req.prefix))
        if cached + new == req.prompt_len:
            samples.append(SampleRow(req.id, seq.params, 0))
    return StepSpec(spans, samples)


def record_tokens(tokens: Mapping[int, int], sequences: Mapping[int, TokenSequence],
                  eos_ids: frozenset[int]) -> list[int]:
    """Append each sampled token to its sequence; returns the ids whose token was an end of
    sequence (the cluster stops those that a length limit has not already finished)."""
    for rid, token in tokens.items():
        sequences[rid].output.append(token)
    return [rid for rid, token in tokens.items() if sequences[rid].ends_at(token, eos_ids)]
