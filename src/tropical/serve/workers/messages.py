"""What the router and a worker process say to each other over their pipe.

Commands go one way and each gets exactly one reply, in order. KV never travels in a message:
a worker's migration staging area is a file both processes map (see ``staging``), so only its
name and shape cross the pipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tropical.core.sampling import TokenLogprobs
from tropical.engine.config import ModelConfig
from tropical.engine.kv_events import KVEvent
from tropical.sched.step import StepOutput, StepSpec

if TYPE_CHECKING:  # the tokenizer's module loads torch (GGUF vocabularies); the router must not
    from tropical.engine.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """Everything a worker process needs to start: which model, how big a cache, how many threads;
    ``staging_dir`` holds its migration staging file (None: a backend that moves KV itself)."""

    worker_id: int
    model: str
    dtype: str
    device: str
    threads: int
    kv_tokens: int
    block_size: int
    max_model_len: int
    staging_dir: str | None = None


@dataclass(frozen=True, slots=True)
class StagingArea:
    """A worker's migration buffer: a shared file of [layers, 2, tokens, kv_heads, head_dim]."""

    path: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class Ready:
    """A worker's first message: its model loaded and its cache allocated."""

    worker_id: int
    pid: int
    model_name: str
    config: ModelConfig
    tokenizer: Tokenizer
    chat: bool
    num_blocks: int
    block_size: int
    max_model_len: int
    staging: StagingArea | None


@dataclass(frozen=True, slots=True)
class Step:
    """Free the ``free`` sequences' KV, then run ``spec``; replies with a StepDone."""

    spec: StepSpec
    free: list[int]


@dataclass(frozen=True, slots=True)
class StepDone:
    """The step's sampled tokens, its compute time, what its prefix cache stored and evicted
    since the last step (KV events), and the logprobs of the sampled tokens and prompt spans
    whose requests asked for them (by request id; see StepOutput)."""

    tokens: dict[int, int]
    seconds: float
    events: list[KVEvent] = field(default_factory=list)
    logprobs: dict[int, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)

    @property
    def output(self) -> StepOutput:
        return StepOutput(self.tokens, self.logprobs, self.prompt_logprobs)


@dataclass(frozen=True, slots=True)
class Free:
    """Release these sequences' KV blocks (unknown ids are ignored); replies None."""

    seq_ids: list[int]


@dataclass(frozen=True, slots=True)
class Export:
    """Copy ``tokens`` tokens of a sequence's KV from its token ``start`` on (those its target
    lacks) into this worker's staging area from token ``offset`` on; replies with the seconds it
    took."""

    seq_id: int
    tokens: int
    offset: int = 0
    start: int = 0


@dataclass(frozen=True, slots=True)
class Import:
    """Copy ``tokens`` tokens of KV at ``offset`` of ``source``'s staging area into ``seq_id``'s
    blocks from its token ``start`` on, the first ``start`` being this worker's cached run of
    ``block_hashes``; replies with the KV events of the import (what it stored, and evicted to
    make room)."""

    seq_id: int
    source: StagingArea
    tokens: int
    offset: int = 0
    start: int = 0
    block_hashes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Profile:
    """Measure this engine (its cache must be empty) on a named grid of engine.profiler.GRIDS and
    reply with the profile's dict."""

    grid: str


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to one command: ``value``, or ``error`` when the command failed (the worker lives on)."""

    value: Any = None
    error: str | None = None
