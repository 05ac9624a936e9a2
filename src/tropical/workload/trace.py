"""A trace: requests as (arrival, prompt length, output length), independent of its file format."""

from __future__ import annotations

from dataclasses import dataclass, field

PREFIX_BLOCK_TOKENS = 512
"""Tokens each of a trace entry's ``prefix_blocks`` covers (Mooncake's ``hash_ids``)."""


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One request of a trace. ``arrival`` is seconds from the trace's first request;
    ``prefix_blocks`` names its prompt's blocks of ``PREFIX_BLOCK_TOKENS`` by chained hash."""

    arrival: float
    input_len: int
    output_len: int
    prefix_blocks: tuple[int, ...] = ()

    def block_tokens(self, i: int) -> int:
        """Prompt tokens its prefix block ``i`` covers (the last may be partial)."""
        return min(PREFIX_BLOCK_TOKENS, self.input_len - i * PREFIX_BLOCK_TOKENS)


@dataclass(frozen=True, slots=True)
class Trace:
    """An ordered list of entries with the name it was loaded under.

    ``timed`` is False for a file that records lengths only: its arrivals are all 0 until a
    request rate gives it an arrival process (``workload.transform.at_rate``). ``prefix_note``
    says why some entries carry no prefix blocks ('' when every one does).
    """

    name: str
    entries: tuple[TraceEntry, ...] = field(default_factory=tuple)
    timed: bool = True
    prefix_note: str = ""

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def duration(self) -> float:
        return self.entries[-1].arrival - self.entries[0].arrival if self.entries else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second over the trace's span (0 for fewer than two distinct arrivals)."""
        return len(self.entries) / self.duration if self.duration > 0 else 0.0
