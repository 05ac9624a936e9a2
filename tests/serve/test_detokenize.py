"""Streamed deltas add up to the engine's text: the full decode, trimmed where a stop string first shows."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tropical.engine.generate import trim_at_stop
from tropical.engine.loader import load_model
from tropical.engine.tokenizer import Tokenizer
from tropical.serve.detokenize import Decoder, TextStream

# Whole characters of 1 to 4 UTF-8 bytes, their bytes one by one, and pieces that straddle characters.
PIECES = ["a", "b", "c", " ", "ab", "é", "€", "😀", "é€", *("é€😀".encode()), b"\xe2\x82", b"\xac a", b"\xff"]


@dataclass
class ByteTokenizer:
    """Token i is the bytes of PIECES[i]; invalid sequences decode to U+FFFD as in byte-level BPE."""

    vocab: list[bytes] = field(default_factory=lambda: [to_bytes(p) for p in PIECES])
    decoded_tokens: int = 0

    def decode(self, ids: list[int]) -> str:
        self.decoded_tokens += len(ids)
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")


def to_bytes(piece: str | bytes | int) -> bytes:
    if isinstance(piece, int):
        return bytes([piece])
    return piece if isinstance(piece, bytes) else piece.encode()


def stream(tokenizer: Decoder, pushes: list[list[int]], stops: list[str]) -> tuple[str, TextStream]:
    """Push each chunk until the stream stops, as the router does, then finish."""
    text_stream = TextStream(tokenizer, stops)
    deltas = []
    for chunk in pushes:
        deltas.append(text_stream.push(chunk))
        if text_stream.stopped:
            break
    deltas.append(text_stream.finish())
    return "".join(deltas), text_stream


def engine_text(tokenizer: Decoder, pushes: list[list[int]], stops: list[str]) -> str:
    """What generate() returns: decode after each step, end at the first step whose text holds a stop."""
    ids: list[int] = []
    for chunk in pushes:
        ids += chunk
        text, stopped = trim_at_stop(tokenizer.decode(ids), stops)
        if stopped:
            return text
    return tokenizer.decode(ids)


token_chunks = st.lists(st.lists(st.integers(0, len(PIECES) - 1), max_size=3), max_size=30)
stop_lists = st.lists(st.text(alphabet="abcé€😀 ", min_size=1, max_size=3), max_size=4)


@settings(max_examples=500, deadline=None)
@given(pushes=token_chunks, stops=stop_lists)
def test_deltas_add_up_to_the_trimmed_decode(pushes: list[list[int]], stops: list[str]) -> None:
    tokenizer = ByteTokenizer()
    text, _ = stream(tokenizer, pushes, stops)
    assert text == engine_text(tokenizer, pushes, stops)


@settings(max_examples=300, deadline=None)
@given(pushes=token_chunks)
def test_no_delta_ends_in_a_split_character_until_finish(pushes: list[list[int]]) -> None:
    text_stream = TextStream(ByteTokenizer(), [])
    for chunk in pushes:
        assert not text_stream.push(chunk).endswith("\ufffd")


def test_a_split_character_is_held_until_complete() -> None:
    euro = [PIECES.index(b) for b in (0xE2, 0x82, 0xAC)]
    text_stream = TextStream(ByteTokenizer(), [])
    assert [text_stream.push([t]) for t in euro] == ["", "", "€"]


def test_a_possible_stop_prefix_is_held_then_released() -> None:
    a, b = PIECES.index("a"), PIECES.index("b")
    text_stream = TextStream(ByteTokenizer(), ["abc", "x"])
    assert [text_stream.push([t]) for t in (b, a, b)] == ["b", "", ""]
    assert text_stream.push([a]) == "ab"
    assert text_stream.finish() == "a" and not text_stream.stopped


def test_a_stop_string_cuts_the_text_and_stops_the_stream() -> None:
    a, b, c, ab = (PIECES.index(p) for p in ("a", "b", "c", "ab"))
    text_stream = TextStream(ByteTokenizer(), ["bc"])
    assert text_stream.push([a, ab]) == "aa"
    assert text_stream.push([c, a]) == ""
    assert text_stream.stopped
    assert text_stream.push([a]) == "" and text_stream.finish() == ""


def test_finish_releases_an_incomplete_character_as_decoded() -> None:
    text_stream = TextStream(ByteTokenizer(), [])
    assert text_stream.push([PIECES.index("a"), PIECES.index(b"\xe2\x82")]) == "a"
    assert text_stream.finish() == "\ufffd"


def test_decoding_cost_grows_linearly_with_the_output() -> None:
    tokenizer = ByteTokenizer()
    text_stream = TextStream(tokenizer, ["zz"])
    for _ in range(2000):
        text_stream.push([PIECES.index("é")])
    assert tokenizer.decoded_tokens < 10 * 2000


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Tokenizer:
    return load_model("tiny-random").tokenizer


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_tiny_random_tokenizer_streams_like_the_engine(
    tiny_tokenizer: Tokenizer, data: st.DataObject,
) -> None:
    vocab = tiny_tokenizer.vocab_size
    pushes = data.draw(st.lists(st.lists(st.integers(0, vocab - 1), max_size=3), max_size=25))
    stop_ids = data.draw(st.lists(st.integers(0, vocab - 1), max_size=3))
    stops = [s for s in (tiny_tokenizer.decode([i]).strip("\ufffd") for i in stop_ids) if s]
    text, _ = stream(tiny_tokenizer, pushes, stops)
    assert text == engine_text(tiny_tokenizer, pushes, stops)
