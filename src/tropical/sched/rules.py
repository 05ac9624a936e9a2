"""Batch-formation rules: what distinguishes vLLM, chunked prefill and disaggregated roles.

One mechanism, different numbers (vLLM v1's lesson): a batch is decodes plus prefill spans under
a token budget; the rules say which goes first, whether prompts may be split, and whether the
worker decodes at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from tropical.sched.slack import SlackRule
from tropical.sched.tightest import TightestPrompt

LATEST_START = -1.0
"""The ``size_weight`` that orders a queue by latest start: the paper's laxity order."""


def check_size_weight(weight: float) -> None:
    """Refuse a queue key that puts a prompt before its own latest start, or none at all."""
    if not (math.isfinite(weight) and weight >= LATEST_START):
        raise ValueError(f"size_weight must be a number of at least {LATEST_START:g} "
                         f"(-1: latest start; 0: deadline), got {weight}")


def check_piece(tokens: int, name: str) -> None:
    """Refuse a negative piece length (``name``: the setting it came from)."""
    if tokens < 0:
        raise ValueError(f"{name} must be 0 (whole prompts) or a number of tokens, got {tokens}")


class Role(str, Enum):
    """A worker's job in the cluster: whether it ``decodes`` and whether it ``takes_arrivals``
    (functions, not attributes the members set: mypyc compiles this module only without those,
    and read from compiled code each was an attribute lookup in Python's own way, at every
    decision)."""

    PREFILL = "prefill"
    DECODE = "decode"
    MULTIPLEX = "multiplex"
    COLOCATED = "colocated"


def decodes(role: Role) -> bool:
    """Does a worker of ``role`` decode? All but prefill workers do."""
    return role is not Role.PREFILL


def takes_arrivals(role: Role) -> bool:
    """Can a fresh request be prefilled on a worker of ``role``? Decode workers only receive
    migrations."""
    return role is not Role.DECODE


@dataclass(frozen=True, slots=True)
class BatchRules:
    """How one worker forms each iteration's batch.

    ``tpot_guard``: re-check, when the batch forms, that multiplexed prefills still fit the
    decodes' TPOT slack under this rule; one that no longer does waits for a later iteration.
    ``laxity``: queue prompts by urgency instead of by arrival: least first by their TTFT
    deadline plus ``size_weight`` times their predicted prefill there (-1, the paper's: the
    latest time their prefill may start and still meet the SLO, least slack first; 0: the
    deadline, earliest first, as the k-server ideal orders prompts; above 0: shorter prompts
    ahead of longer ones with deadlines near theirs, which serves more prompts in time when not
    all can be).
    ``spare_finishing``: an iteration that finishes a prompt takes no later prompt, whole or a
    chunk, that would make the finished one miss its TTFT SLO (chunked prefill fills each
    iteration's room with the prompts queued next, and a prompt's first token comes when its
    last iteration ends).
    ``piece_tokens``: on a worker that runs prompts whole (not ``chunked``), a lone prompt
    longer than the budget runs in pieces of at most this many tokens (0: whole), and under
    laxity order its rest is queued again by its key after each piece, so that an urgent prompt
    that arrived meanwhile waits for one piece, not the whole prompt (preemption at piece
    boundaries, as the k-server bound's servers preempt; a large piece costs little more than
    the whole prompt, where small chunks cost up to a tenth more).
    ``tightest``: under chunked rules, an iteration that carries prompt chunks also ends within
    the room the tightest TTFT SLO seen leaves (``TightestPrompt.room``; the policy that owns
    these rules keeps it up to date as prompts arrive; None: the decodes' limit alone).
    """

    prefill_first: bool = False
    chunked: bool = False
    token_budget: int = 2048
    max_seqs: int = 256
    tpot_guard: SlackRule | None = None
    laxity: bool = False
    size_weight: float = LATEST_START
    spare_finishing: bool = False
    piece_tokens: int = 0
    tightest: TightestPrompt | None = None

    def __post_init__(self) -> None:
        if self.token_budget < 1 or self.max_seqs < 1:
            raise ValueError("token_budget and max_seqs must be at least 1")
        check_size_weight(self.size_weight)
        check_piece(self.piece_tokens, "piece_tokens")
