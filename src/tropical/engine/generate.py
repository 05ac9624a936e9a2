"""Generate text for one prompt: prefill, then decode steps through the paged cache, until a stop.

The simplest correct path through the engine, for the CLI, smoke tests and reference outputs; batching many
requests is the worker loop's job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.engine.batch import FlatBatch, Span
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.loader import LoadedModel
from tropical.engine.sampling import SamplingParams, sample_rows
from tropical.sched.step import StepOutput, TokenSequence, record_step

BLOCK_SIZE = 16
SEQ_ID = 0
NO_SLO = SLO(ttft=math.inf, tpot=math.inf)


@dataclass(frozen=True)
class GenerationResult:
    """`token_ids` are the generated ids (an eos or stop token id is not included); `text` is trimmed
    at a stop string."""

    text: str
    token_ids: list[int]
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int


def generate(
    loaded: LoadedModel,
    prompt: str,
    max_tokens: int = 64,
    sampling: SamplingParams | None = None,
    stop: list[str] | None = None,
    chat: bool | None = None,
) -> GenerationResult:
    """Complete `prompt`, sent as a user message through the chat template when the model has one."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    stops = list(stop or [])
    if any(not s for s in stops):
        raise ValueError("stop strings must be non-empty")
    prompt_ids = encode_prompt(loaded, prompt, loaded.chat if chat is None else chat)
    context = loaded.config.max_position_embeddings
    if len(prompt_ids) >= context:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room in the {context}-token context")
    budget = min(max_tokens, context - len(prompt_ids))
    ids, reason = _decode_loop(loaded, prompt_ids, budget, sampling or SamplingParams(), stops)
    text, stopped = trim_at_stop(loaded.tokenizer.decode(ids), stops)
    return GenerationResult(text, ids, "stop" if stopped else reason, len(prompt_ids))


def encode_prompt(loaded: LoadedModel, prompt: str, chat: bool) -> list[int]:
    """Token ids of the prompt; chat=True without a template is the caller's mistake, so it is an error."""
    if chat:
        prompt = loaded.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    ids = loaded.tokenizer.encode(prompt)
    if not ids:
        raise ValueError("prompt is empty")
    return ids


def _decode_loop(
    loaded: LoadedModel, prompt_ids: list[int], budget: int, params: SamplingParams, stops: list[str]
) -> tuple[list[int], Literal["stop", "length"]]:
    """Generated ids and why generation ended; the eos or stop token id that ends it is dropped.
    The sampling features (penalties, bias, min_tokens, stop token ids) apply as in a worker."""
    device = next(loaded.model.parameters()).device
    dtype = next(loaded.model.parameters()).dtype
    blocks = -(-(len(prompt_ids) + budget) // BLOCK_SIZE)
    cache = PagedKVCache(loaded.config, blocks, BLOCK_SIZE, dtype=dtype, device=device)
    eos = frozenset(loaded.tokenizer.eos_token_ids)
    seq = TokenSequence(Request(SEQ_ID, 0.0, len(prompt_ids), budget, NO_SLO), list(prompt_ids), params)
    span = Span(SEQ_ID, prompt_ids, 0)
    while len(seq.output) < budget:
        logits = loaded.model(FlatBatch.build([span], cache), cache)
        token = sample_rows(logits, [seq.row(len(seq.output), eos)])[0][0]
        if record_step(StepOutput({SEQ_ID: token}), {SEQ_ID: seq}, eos).ended:
            return seq.output[:-1], "stop"
        if stops and trim_at_stop(loaded.tokenizer.decode(seq.output), stops)[1]:
            return seq.output, "stop"
        span = Span(SEQ_ID, [token], span.total)
    return seq.output, "length"


def trim_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """Text before the earliest stop string, and whether one occurred."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)
