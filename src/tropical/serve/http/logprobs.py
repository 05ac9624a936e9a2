"""Logprobs in OpenAI's two wire shapes, laid out as vLLM lays them out.

Each position's alternatives are the chosen token first, then the top ones, a token listed once
(vLLM's order): completions show the chosen token and ``k`` more (OpenAI's "top k + 1"), chat shows
the first ``k`` of that order. A logprob of -inf is sent as -9999.0, which JSON can carry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tropical.core.sampling import TokenLogprobs

FLOOR = -9999.0
TokenText = Callable[[int], str]
"""A token's own text, as a client reads it beside its logprob."""


def alternatives(entry: TokenLogprobs) -> dict[int, float]:
    """Token id -> logprob: the chosen token, then the top alternatives not already listed."""
    listed = {entry.token: entry.logprob}
    for token, logprob in entry.top:
        listed.setdefault(token, logprob)
    return listed


def completion_logprobs(entries: Sequence[TokenLogprobs | None], tokens: Sequence[int], k: int,
                        text_of: TokenText, offset: int = 0) -> dict:
    """/v1/completions' ``logprobs`` object for ``tokens``, whose entries are None where nothing
    precedes a token (a prompt's first); ``offset``: where the first token's text starts in the
    choice's text."""
    texts: list[str] = []
    offsets: list[int] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    for token, entry in zip(tokens, entries, strict=True):
        text = text_of(token)
        offsets.append(offset)
        offset += len(text)
        texts.append(text)
        if entry is None:
            token_logprobs.append(None)
            tops.append(None)
            continue
        token_logprobs.append(max(entry.logprob, FLOOR))
        tops.append({text_of(t): max(lp, FLOOR) for i, (t, lp) in enumerate(alternatives(entry).items())
                     if i <= k})
    return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": texts, "top_logprobs": tops}


def chat_logprobs(entries: Sequence[TokenLogprobs], k: int, text_of: TokenText) -> dict:
    """/v1/chat/completions' ``logprobs`` object: one content entry per generated token."""
    return {"content": [chat_entry(entry, k, text_of) for entry in entries]}


def chat_entry(entry: TokenLogprobs, k: int, text_of: TokenText) -> dict:
    top = [chat_token(text_of(t), lp) for i, (t, lp) in enumerate(alternatives(entry).items()) if i < k]
    return {**chat_token(text_of(entry.token), entry.logprob), "top_logprobs": top}


def chat_token(text: str, logprob: float) -> dict:
    utf8 = list(text.encode("utf-8", errors="replace"))
    return {"token": text, "logprob": max(logprob, FLOOR), "bytes": utf8}
