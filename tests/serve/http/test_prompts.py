"""From a parsed request to tokens: text far beyond the context is refused before tokenizing."""

from __future__ import annotations

import pytest

from tropical.serve.http.prompts import CHARS_PER_TOKEN_BOUND, Limits, to_submission
from tropical.serve.http.protocol import APIError, GenerationRequest


class CountingTokenizer:
    """One token per character, counting how many characters it was asked to encode."""

    chat_template = "{{ messages }}"
    vocab_size = 1000

    def __init__(self) -> None:
        self.encoded = 0

    def encode_without_gil(self, text: str) -> list[int]:
        self.encoded += len(text)
        return [1] * len(text)

    def apply_chat_template(self, messages: list[dict]) -> str:
        return "".join(m["content"] for m in messages)


@pytest.mark.parametrize("chat", [False, True])
def test_text_beyond_the_bound_is_refused_without_tokenizing(chat: bool) -> None:
    text = "a" * (100 * CHARS_PER_TOKEN_BOUND + 1)
    messages = [{"role": "user", "content": text}] if chat else None
    gen = GenerationRequest("m", chat, "" if chat else text, messages)
    tokenizer = CountingTokenizer()
    with pytest.raises(APIError) as caught:
        to_submission(gen, tokenizer, Limits(max_model_len=100))  # type: ignore[arg-type]
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == ("messages" if chat else "prompt") and tokenizer.encoded == 0


def test_text_within_the_bound_is_tokenized_and_checked_exactly() -> None:
    tokenizer = CountingTokenizer()
    with pytest.raises(APIError, match="120 tokens"):
        to_submission(GenerationRequest("m", False, "a" * 120), tokenizer, Limits(max_model_len=100))  # type: ignore[arg-type]
    assert tokenizer.encoded == 120
    fits = to_submission(GenerationRequest("m", False, "a" * 50), tokenizer, Limits(100))  # type: ignore[arg-type]
    assert len(fits.prompt_ids) == 50
