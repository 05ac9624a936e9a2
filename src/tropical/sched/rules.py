"""Batch-formation rules: what distinguishes vLLM, chunked prefill and disaggregated roles.

One mechanism, different numbers (vLLM v1's lesson): a batch is decodes plus prefill spans under
a token budget; the rules say which goes first, whether prompts may be split, and whether the
worker decodes at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from tropical.sched.slack import SlackRule


class Role(str, Enum):
    """A worker's job in the cluster: whether it ``decodes`` (all but prefill workers) and
    whether it ``takes_arrivals`` (a fresh request can be prefilled there; decode workers only
    receive migrations). Both are set once per role: the schedulers ask at every decision."""

    PREFILL = "prefill"
    DECODE = "decode"
    MULTIPLEX = "multiplex"
    COLOCATED = "colocated"

    def __init__(self, value: str) -> None:
        self.decodes = value != "prefill"
        self.takes_arrivals = value != "decode"


@dataclass(frozen=True, slots=True)
class BatchRules:
    """How one worker forms each iteration's batch.

    ``tpot_guard``: re-check, when the batch forms, that multiplexed prefills still fit the
    decodes' TPOT slack under this rule; one that no longer does waits for a later iteration.
    ``laxity``: queue prompts by the latest time their prefill may start and still meet the
    TTFT SLO (least slack first) instead of by arrival.
    ``spare_finishing``: an iteration that finishes a prompt takes no chunk of a later prompt that
    would make the finished one miss its TTFT SLO (chunked prefill fills each iteration's room
    with the next prompt, and a prompt's first token comes when its last iteration ends).
    """

    prefill_first: bool = False
    chunked: bool = False
    token_budget: int = 2048
    max_seqs: int = 256
    tpot_guard: SlackRule | None = None
    laxity: bool = False
    spare_finishing: bool = False

    def __post_init__(self) -> None:
        if self.token_budget < 1 or self.max_seqs < 1:
            raise ValueError("token_budget and max_seqs must be at least 1")
