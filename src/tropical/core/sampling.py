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
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}")
        for token, bias in self.logit_bias:
            if token < 0:
                raise ValueError(f"logit_bias token ids must be >= 0, got {token}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias of token {token} must be in [-100, 100], got {bias}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if any(token < 0 for token in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be >= 0, got {list(self.stop_token_ids)}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 (or None for none), got {value}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def penalized(self) -> bool:
        """Whether any penalty applies (the sampler then needs the output tokens so far)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)

    @property
    def plain(self) -> bool:
        """Nothing beyond temperature, top-k and top-p: the sampler's fast path (no logprobs, no
        penalties, no bias, no banned tokens)."""
        return (self.logprobs is None and not self.penalized and not self.logit_bias
                and not self.min_tokens)


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One position's logprobs: the chosen (sampled, or prompt) ``token`` with its ``logprob`` and
    its ``rank`` among the vocabulary (1 = most likely), and the ``top`` alternatives as (token id,
    logprob) pairs, most likely first, as many as the request asked for."""

    token: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()
