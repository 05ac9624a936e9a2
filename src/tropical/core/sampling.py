"""How a request wants its tokens chosen: the spec the router carries and the engine's sampler reads.

Kept apart from the sampler so that the router and the simulator's paths import no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GREEDY_BELOW = 1e-5
"""Temperatures under this sample greedily, as in vLLM: dividing logits by a tinier one overflows
to inf and the softmax to nan, and the distribution is one-hot long before that."""

@dataclass(frozen=True, slots=True)
class SamplingParams:
    """temperature 0 (or below ``GREEDY_BELOW``) means greedy; top_k 0 and top_p 1 switch those
    filters off. Penalties, ``logit_bias``, ``min_tokens`` and ``stop_token_ids`` follow vLLM's
    semantics; ``logprobs``: how many top alternatives to report beside each sampled token's own
    logprob (None: report none); ``prompt_logprobs``: the same for the prompt's tokens (echo);
    ``processed_logprobs``: report them after temperature and penalties instead of from the raw
    logits (vLLM's ``--logprobs-mode processed_logprobs`` against its default ``raw_logprobs``)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    processed_logprobs: bool = False

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One position's logprobs: the chosen (sampled, or prompt) ``token`` with its ``logprob`` and
    its ``rank`` among the vocabulary (1 = most likely), and the ``top`` alternatives as (token id,
    logprob) pairs, most likely first, as many as the request asked for."""

    token: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()
