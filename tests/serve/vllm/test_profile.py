"""The HTTP profiler of a vLLM server times one decode iteration per streamed token, however many
tokens a chunk carries."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import pytest

from tropical.serve.vllm import profile
from tropical.serve.vllm.profile import ServerProfiler


@dataclass
class Chunk:
    token_ids: list[int]


class Clock:
    """A perf_counter that each streamed chunk moves on by its tokens' iterations."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CoalescingServer:
    """Streams ``tokens`` tokens, ``per_chunk`` to a chunk, one decode iteration of ``step``
    seconds per token."""

    def __init__(self, clock: Clock, per_chunk: int, step: float = 0.05) -> None:
        self.clock, self.per_chunk, self.step = clock, per_chunk, step

    async def stream(self, body: dict[str, Any]) -> AsyncGenerator[Chunk, None]:
        sent = 0
        while sent < body["max_tokens"]:
            n = min(self.per_chunk, body["max_tokens"] - sent)
            self.clock.now += n * self.step
            sent += n
            yield Chunk(list(range(n)))


@pytest.mark.parametrize("per_chunk", [1, 2, 3])
def test_a_decode_iteration_is_timed_per_token_when_chunks_carry_several(
        per_chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(profile.time, "perf_counter", clock)
    profiler = ServerProfiler(CoalescingServer(clock, per_chunk))  # type: ignore[arg-type]
    assert asyncio.run(profiler.decode_seconds(1, 64, 12)) == pytest.approx(0.05)
