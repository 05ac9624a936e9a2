"""One iteration as an executor runs it: spans of new tokens and the rows to sample.

Built from sched's batch and each request's tokens, and model-free, so the router plans a worker
process's steps without torch, and a single engine worker plans its own the same way.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tropical.core.request import Request
from tropical.core.sampling import SamplingParams, TokenLogprobs
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
        """Follow ``token``, just sampled. Either method raises ValueError when the grammar cannot
        go on; that fails its request alone (``TokenSequence.failure``)."""
        ...


@dataclass(slots=True)
class TokenSequence:
    """A request's tokens and sampling settings; ``output`` holds every token sampled so far,
    ``logprobs`` those of the sampled tokens and ``prompt_logprobs`` those of its prompt's tokens
    from the second on (gathered chunk by chunk) when the request asked for them, ``constraint``
    its grammar matcher, if it has one, and ``failure`` why that matcher could not go on (the
    request must then end with that error). ``plain``: neither its params nor a grammar ask the
    sampler for more than temperature, top-k and top-p (fixed at construction: the fast path's
    test, made for every request at every step)."""

    req: Request
    prompt: list[int]
    params: SamplingParams
    ignore_eos: bool = False
    output: list[int] = field(default_factory=list)
    constraint: TokenConstraint | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    failure: str | None = None
    plain: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.prompt) != self.req.prompt_len:
            raise ValueError(f"request {self.req.id}: {len(self.prompt)} prompt ids, "
                             f"prompt_len {self.req.prompt_len}")
        self.plain = self.params.plain and self.constraint is None

    @property
    def cached(self) -> int:
        """Tokens whose KV is in the cache once the prompt is done: all but the last sampled one."""
        return self.req.prompt_len + len(self.output) - 1

    def stop_ids(self, eos_ids: frozenset[int]) -> frozenset[int]:
        """The tokens this request stops at: its ``stop_token_ids``, and the end-of-sequence ids
        unless it ignores them."""
        stops = frozenset(self.params.stop_token_ids)
        return stops if self.ignore_eos else stops | eos_ids

    def ends_at(self, token: int, eos_ids: frozenset[int]) -> bool:
        """True when ``token``, just appended, ends the request: a stop token once it has at least
        ``min_tokens`` output tokens (vLLM's rule)."""
        if token in self.params.stop_token_ids:
            return len(self.output) >= self.params.min_tokens
        if token not in eos_ids or self.ignore_eos:
            return False
        # under min_tokens an eos is drawn only when a finished grammar allows nothing else
        return len(self.output) >= self.params.min_tokens or self.constraint is not None

    def banned(self, eos_ids: frozenset[int]) -> tuple[int, ...]:
        """The tokens its next draw may not take: the stop tokens while it has fewer than
        ``min_tokens`` output tokens."""
        if len(self.output) >= self.params.min_tokens:
            return ()
        return tuple(sorted(self.stop_ids(eos_ids)))

    def row(self, step: int, eos_ids: frozenset[int]) -> SampleRow:
        """Its next token's row, with what the sampler needs beyond the params: only what the
        request's features use, so a plain request's row carries nothing more."""
        params = self.params
        if self.plain:
            return SampleRow(self.req.id, params, step)
        return SampleRow(
            self.req.id, params, step,
            output=tuple(self.output) if params.penalized else (),
            prompt=tuple(self.prompt) if params.repetition_penalty != 1 else (),
            banned=self.banned(eos_ids),
            allowed=self._allowed())

    def _allowed(self) -> bytes | None:
        """The grammar's mask for the next token; None without a grammar, or once it failed."""
        if self.constraint is None or self.failure is not None:
            return None
        try:
            return self.constraint.allowed()
        except ValueError as exc:
            self.failure = str(exc)
            return None

    def follow_grammar(self, token: int) -> None:
        """Let the grammar follow a sampled token (a refusal becomes ``failure``)."""
        if self.constraint is None or self.failure is not None:
            return
        try:
            self.constraint.accept(token)
        except ValueError as exc:
            self.failure = str(exc)


@dataclass(frozen=True, slots=True)
class SampleRow:
    """Sample the next token of ``seq_id`` from its span's logits; ``step`` seeds the draw.
    Beyond a plain request's row: the ``output`` so far (penalties), the ``prompt`` (repetition
    penalty), the ``banned`` tokens (stop tokens under ``min_tokens``), and the grammar's
    ``allowed`` bitmask (TokenConstraint.allowed's layout)."""

    seq_id: int
    params: SamplingParams
    step: int
    output: tuple[int, ...] = ()
    prompt: tuple[int, ...] = ()
    banned: tuple[int, ...] = ()
    allowed: bytes | None = None

    @property
    def plain(self) -> bool:
        """Sampled on the fast path: temperature, top-k and top-p only, no logprobs."""
        return self.params.plain and self.allowed is None


@dataclass(frozen=True, slots=True)
class PromptRow:
    """Score a prompt span's tokens for prompt logprobs: position ``i`` of the span predicts
    ``targets[i]``, the prompt token after it (a prompt's last position predicts a sampled token,
    so a span ending the prompt has one target fewer than tokens); ``top`` alternatives each."""

    seq_id: int
    targets: list[int]
    top: int


@dataclass(frozen=True, slots=True)
class StepSpec:
    """What an executor runs: one forward over ``spans``, then a token for each of ``samples``
    (in span order; a prompt chunk that does not end its prompt samples nothing), and the prompt
    logprobs of each of ``prompts``."""

    spans: list[Span]
    samples: list[SampleRow]
    prompts: list[PromptRow] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What a step produced: each sampled row's token, its logprobs for rows that asked, and for
    each prompt row the logprobs of its targets, in order."""

    tokens: dict[int, int]
    logprobs: dict[int, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)


def step_spec(batch: Batch, decoding: Iterable[int], sequences: Mapping[int, TokenSequence],
              eos_ids: frozenset[int] = frozenset()) -> StepSpec:
    """The executor's view of ``batch``: one span per decoding request (ids in batch order), then
    the prompt spans; a prompt that ends in this step samples its first token. ``eos_ids`` are
    banned from the rows of requests still under their ``min_tokens``."""
    seqs = [sequences[rid] for rid in decoding] if batch.decode_count else []
    spans = [Span(s.req.id, [s.output[-1]], s.cached) for s in seqs]
    samples = [s.row(len(s.output), eos_ids) for s in seqs]
    prompts = []
    for req, new, cached in batch.prefills:
        seq = sequences[req.id]
        spans.append(Span(req.id, seq.prompt[cached:cached + new], cached, req.prefix))
        top = seq.params.prompt_logprobs
        if top is not None and cached + 1 < req.prompt_len:
            prompts.append(PromptRow(req.id, seq.prompt[cached + 1:cached + new + 1], top))
        if cached + new == req.prompt_len:
            samples.append(seq.row(0, eos_ids))
    return StepSpec(spans, samples, prompts)


@dataclass(frozen=True, slots=True)
class Recorded:
    """What a step did to its requests beyond their tokens: those it ``ended`` (an end of
    sequence or a stop token id, past ``min_tokens``; the cluster stops those that a length limit
    has not already finished), and those whose grammar could not go on, with why (``failed``:
    each must end with that error, the others go on)."""

    ended: list[int]
    failed: dict[int, str]


def record_step(output: StepOutput, sequences: Mapping[int, TokenSequence],
                eos_ids: frozenset[int]) -> Recorded:
    """Keep a step's output with its sequences: each sampled token (its grammar following it),
    each prompt span's logprobs after the earlier spans', each sampled token's after the earlier
    tokens'. One pass for every engine's post-processing, so that a step's way stays short."""
    for rid, scored in output.prompt_logprobs.items():
        sequences[rid].prompt_logprobs.extend(scored)
    for rid, token_logprobs in output.logprobs.items():
        sequences[rid].logprobs.append(token_logprobs)
    ended, failed = [], {}
    for rid, token in output.tokens.items():
        seq = sequences[rid]
        seq.output.append(token)
        if seq.constraint is not None:
            seq.follow_grammar(token)
            if seq.failure is not None:
                failed[rid] = seq.failure
        if seq.ends_at(token, eos_ids):
            ended.append(rid)
    return Recorded(ended, failed)
