"""Next-token choice per request: greedy, or temperature, top-k and top-p with a seeded generator."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

GREEDY_BELOW = 1e-5
"""Temperatures under this sample greedily, as in vLLM: dividing logits by a tinier one overflows
to inf and the softmax to nan, and the distribution is one-hot long before that."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """temperature 0 (or below ``GREEDY_BELOW``) means greedy; top_k 0 and top_p 1 switch those
    filters off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

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


def step_generator(params: SamplingParams, step: int, device: torch.device | str = "cpu"
                   ) -> torch.Generator | None:
    """The generator for a seeded request's ``step``-th token: a pure function of (seed, step), so the
    draw is the same whichever worker or process samples it (a migrated request keeps its stream)."""
    if params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed((params.seed * 1_000_003 + step) % 2**63)


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """One token per row of logits [n, vocab]; each row uses its own params and generator."""
    if not len(params) == len(generators) == logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} logit rows, {len(params)} params, {len(generators)} generators")
    return [_sample_row(row, p, g) for row, p, g in zip(logits, params, generators, strict=True)]


def _sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    if params.greedy:
        return int(logits.argmax())
    scaled = logits.float() / params.temperature
    if params.top_k:
        scaled = _top_k(scaled, params.top_k)
    if params.top_p < 1:
        scaled = _top_p(scaled, params.top_p)
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k >= logits.shape[-1]:
        return logits
    threshold = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < threshold, -math.inf)


def _top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches p (always at least one)."""
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    drop = probs.cumsum(-1) - probs >= p
    return logits.masked_fill(drop.scatter(-1, order, drop), -math.inf)
