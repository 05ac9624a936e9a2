"""From a validated OpenAI request to the router's Submission: tokens, limits and sampling.

Everything here needs the model (its tokenizer, template and context), which the wire format
does not know; every refusal is a 400 naming the field. The app runs this in a thread: tokenizing
a long text takes long, and text too long for any tokenizer to fit the context is refused first.
"""

from __future__ import annotations

from dataclasses import dataclass

from tropical.core.sampling import SamplingParams
from tropical.engine.tokenizer import Tokenizer
from tropical.serve.http.protocol import APIError, GenerationRequest
from tropical.serve.http.sampling_fields import SamplingFields
from tropical.serve.streams import Submission

COMPLETION_DEFAULT_MAX_TOKENS = 16
"""OpenAI's documented default for /v1/completions; chat defaults to the rest of the context."""
CHARS_PER_TOKEN_BOUND = 32
"""More characters than one token of any real tokenizer covers on average (English runs ~4): text
longer than the context times this cannot fit, so it is refused without tokenizing it."""


@dataclass(frozen=True)
class Limits:
    """What this server allows a request: ``max_logprobs`` alternatives per token, ``max_n``
    choices (vLLM's --max-logprobs and OpenAI's n), and whether logprobs are reported after
    temperature and penalties (``processed``) or from the raw logits (vLLM's default)."""

    max_model_len: int = 4096
    max_logprobs: int = 20
    max_n: int = 16
    processed_logprobs: bool = False


def to_submission(gen: GenerationRequest, tokenizer: Tokenizer, limits: Limits) -> Submission:
    max_model_len = limits.max_model_len
    field = "messages" if gen.chat else "prompt"
    _check_text_length(gen, max_model_len, field)
    prompt_ids = _prompt_ids(gen, tokenizer)
    if len(prompt_ids) >= max_model_len:
        raise APIError(400, f"the prompt is {len(prompt_ids)} tokens; this model's context is "
                            f"{max_model_len} tokens, which leaves no room to generate", param=field,
                       code="context_length_exceeded")
    room = max_model_len - len(prompt_ids)
    max_tokens = gen.max_tokens
    if max_tokens is None:
        max_tokens = room if gen.chat else min(COMPLETION_DEFAULT_MAX_TOKENS, room)
    elif max_tokens > room:
        raise APIError(400, f"max_tokens is {max_tokens}, but the prompt's {len(prompt_ids)} tokens leave "
                            f"{room} of this model's {max_model_len}-token context", param="max_tokens",
                       code="context_length_exceeded")
    params = sampling_params(gen, max_tokens, tokenizer.vocab_size, limits)
    return Submission(prompt_ids, max_tokens, params, list(gen.stop), gen.ignore_eos,
                      gen.slo_ttft_ms, gen.slo_tpot_ms, gen.retry)


def sampling_params(gen: GenerationRequest, max_tokens: int, vocab: int, limits: Limits) -> SamplingParams:
    """The engine's sampling spec, once every field fits this server and this model."""
    fields = gen.sampling
    _check_limits(fields, gen.chat, max_tokens, vocab, limits)
    seed = None if gen.seed is None else gen.seed % 2**63  # OpenAI allows negative seeds
    params = SamplingParams(
        gen.temperature, gen.top_p, gen.top_k or 0, seed,
        presence_penalty=fields.presence_penalty, frequency_penalty=fields.frequency_penalty,
        repetition_penalty=fields.repetition_penalty, logit_bias=tuple(sorted(fields.logit_bias.items())),
        min_tokens=fields.min_tokens, stop_token_ids=tuple(fields.stop_token_ids), logprobs=fields.logprobs,
        prompt_logprobs=fields.logprobs if fields.echo else None,
        processed_logprobs=limits.processed_logprobs,
    )
    if fields.n > 1 and params.greedy:
        raise APIError(400, f"n must be 1 when sampling greedily (temperature {gen.temperature:g}): every "
                            f"choice would be the same, and vLLM refuses it too", param="n")
    return params


def _check_limits(fields: SamplingFields, chat: bool, max_tokens: int, vocab: int, limits: Limits) -> None:
    if fields.logprobs is not None and fields.logprobs > limits.max_logprobs:
        name = "top_logprobs" if chat else "logprobs"
        raise APIError(400, f"{name} is {fields.logprobs}; this server reports at most {limits.max_logprobs} "
                            f"(--max-logprobs)", param=name)
    if fields.n > limits.max_n:
        raise APIError(400, f"n is {fields.n}; this server makes at most {limits.max_n} choices per request "
                            f"(--max-n)", param="n")
    if fields.min_tokens > max_tokens:
        raise APIError(400, f"min_tokens ({fields.min_tokens}) is more than max_tokens ({max_tokens})",
                       param="min_tokens")
    for name, ids in (("logit_bias", fields.logit_bias), ("stop_token_ids", fields.stop_token_ids)):
        bad = next((t for t in ids if t >= vocab), None)
        if bad is not None:
            raise APIError(400, f"{name} names token id {bad}, outside this model's vocabulary "
                                f"(0..{vocab - 1})", param=name)


def _check_text_length(gen: GenerationRequest, max_model_len: int, field: str) -> None:
    if isinstance(gen.prompt, list):
        return
    chars = sum(len(m["content"]) for m in gen.messages or []) if gen.chat else len(gen.prompt)
    if chars > max_model_len * CHARS_PER_TOKEN_BOUND:
        raise APIError(400, f"the prompt is {chars} characters, far more than this model's "
                            f"{max_model_len}-token context holds", param=field,
                       code="context_length_exceeded")


def _prompt_ids(gen: GenerationRequest, tokenizer: Tokenizer) -> list[int]:
    if gen.chat:
        if not tokenizer.chat_template:
            raise APIError(400, "this model has no chat template; use /v1/completions", param="messages")
        ids = tokenizer.encode_without_gil(tokenizer.apply_chat_template(gen.messages or []))
    elif isinstance(gen.prompt, str):
        ids = tokenizer.encode_without_gil(gen.prompt)
    else:
        ids = list(gen.prompt)
        vocab = tokenizer.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside this model's vocabulary (0..{vocab - 1})",
                           param="prompt")
    if not ids:
        raise APIError(400, "the prompt is empty", param="messages" if gen.chat else "prompt")
    return ids
