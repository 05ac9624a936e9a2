"""A request's life: what it asks for, where it ran, and when each milestone happened.

Timestamps are plain floats on whatever clock the substrate runs (virtual in the simulator,
monotonic seconds in the server), so metrics are computed the same way for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from tropical.core.slo import SLO


class PrefillPath(str, Enum):
    """Where a request's prefill ran, the multiplexing toggle's decision."""

    NONE = "none"
    COLOCATED = "colocated"
    PREFILL_WORKER = "prefill"
    MULTIPLEX = "multiplex"
    FALLBACK = "fallback"


@dataclass(slots=True, eq=False)
class Request:
    """One inference request. ``output_len`` is the number of tokens it will generate.

    ``max_gap`` is the longest time between two of its tokens booked so far (the worker that
    decodes it books the gaps; see ``WorkerState``); ``gap_step`` is the worker's decode step
    from which that worker's gap history applies to it. ``yielded``: its TTFT SLO is out of
    reach and it gave up its place in a prefill queue (demotion), so it waits there behind every
    prompt that can still meet its SLO. ``rejected``: the admission stage refused it (why, one of
    ``sched.rejection.REASONS``) before it held KV or ran a token; it fails, and counts as a miss.
    ``cached``: prompt tokens it found computed in the cache of the worker that prefills it, some
    of which it may have computed itself (``own``: the span of its prompt it computed before it
    was taken off a worker's queue, as a prompt cut into pieces that yields; its KV kept as cached
    blocks), so that ``reused`` counts only what other requests computed.
    """

    id: int
    arrival: float
    prompt_len: int
    output_len: int
    slo: SLO
    computed: int = 0
    generated: int = 0
    prefill_start: float | None = None
    first_token: float | None = None
    finish: float | None = None
    path: PrefillPath = PrefillPath.NONE
    reason: str = ""
    prefill_worker: int | None = None
    decode_worker: int | None = None
    migration_time: float = 0.0
    error: str | None = None
    rejected: str | None = None
    max_gap: float = 0.0
    yielded: bool = False
    prefix: tuple[int, ...] = ()
    prefix_block: int = 0
    cached: int = 0
    own: tuple[int, int] = (0, 0)
    migrated_tokens: int = 0
    step_base: int = field(default=0, repr=False)
    gap_step: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError(f"request {self.id}: prompt and output lengths must be at least 1")
        blocks = -(-self.prompt_len // self.prefix_block) if self.prefix_block > 0 else 0
        if len(self.prefix) > blocks:
            raise ValueError(f"request {self.id}: {len(self.prefix)} prefix blocks of {self.prefix_block} "
                             f"tokens do not fit a prompt of {self.prompt_len} tokens")

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV the request holds at its longest: prompt plus all but the last output."""
        return self.prompt_len + self.output_len - 1

    @property
    def reused(self) -> int:
        """Prompt tokens it found cached that other requests computed (the prefix hit): its
        cached run less the part of ``own`` inside it, derived whenever asked, since ``cached``
        moves when a prompt takes the hit it finds as it starts."""
        start, end = self.own
        return self.cached - max(0, min(self.cached, end) - start)

    @property
    def remaining_prompt(self) -> int:
        return self.prompt_len - self.computed

    @property
    def first_token_at(self) -> float:
        """When its first token came, asked only of a request that has one (decoding or done)."""
        assert self.first_token is not None, f"request {self.id} has no first token yet"
        return self.first_token

    def on_pace_until(self, tokens: int) -> float:
        """When its stream, with ``tokens`` out, falls behind its TPOT SLO: its first token plus
        that many SLOs (the deadline a decoding worker keeps it to)."""
        return self.first_token_at + tokens * self.slo.tpot

    @property
    def done(self) -> bool:
        return self.finish is not None or self.error is not None

    def fail(self, now: float, reason: str) -> None:
        """End the request without output; it counts as missing its SLO."""
        self.error = reason
        self.finish = now
