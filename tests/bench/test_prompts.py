"""Prompts: exact token counts, prefixes shared exactly where the trace shares them."""

from __future__ import annotations

from tropical.bench.plan import PlannedRequest
from tropical.bench.prompts import BLOCK_TOKENS, TOKEN_IDS, WORDS, text, token_ids


def req(rid: int, prompt: int, blocks: tuple[int, ...] = ()) -> PlannedRequest:
    return PlannedRequest(rid, 0.0, prompt, 1, blocks)


def test_token_ids_have_the_prompt_length_and_a_safe_range():
    ids = token_ids(req(0, 1300, (7, 8, 9)), seed=0)
    assert len(ids) == 1300 and all(TOKEN_IDS[0] <= i < TOKEN_IDS[1] for i in ids)


def test_shared_prefix_blocks_give_equal_tokens_and_the_rest_differs():
    a = token_ids(req(0, 2 * BLOCK_TOKENS + 50, (7, 8, 100)), seed=0)
    b = token_ids(req(1, 2 * BLOCK_TOKENS + 50, (7, 8, 200)), seed=0)
    assert a[:2 * BLOCK_TOKENS] == b[:2 * BLOCK_TOKENS]
    assert a[2 * BLOCK_TOKENS:] != b[2 * BLOCK_TOKENS:]


def test_requests_without_shared_blocks_share_nothing():
    """Tokens agree only by chance (1 in 400 per position), so no prefix cache block hits."""
    a, b = token_ids(req(0, BLOCK_TOKENS), 0), token_ids(req(1, BLOCK_TOKENS), 0)
    assert a[0] != b[0] and sum(x == y for x, y in zip(a, b, strict=True)) <= 8
    assert token_ids(req(0, 64), 0) == token_ids(req(0, 64), 0)


def test_text_has_one_common_word_per_token():
    words = text(req(0, 200), seed=0).split(" ")
    assert len(words) == 200 and set(words) <= set(WORDS)
