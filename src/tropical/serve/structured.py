"""Structured outputs: OpenAI's ``response_format`` compiled by llguidance into per-token masks.

llguidance is the grammar library behind vLLM's ``guidance`` backend, a wheel with no dependencies
(xgrammar, vLLM's other backend, pulls triton and transformers). We follow vLLM's use of it: a
``json_object`` is the schema ``{"type": "object"}``, flexible whitespace between JSON tokens
(vLLM's default), and once the JSON is complete the matcher allows only end-of-sequence.

A request's schema is compiled once, when the request is checked, so a bad schema is a 400 before
any work; each run of the request then copies the compiled matcher (microseconds), since a request
that reruns after its worker died starts its output over.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from llguidance import LLMatcher, LLTokenizer

from tropical.serve.http.values import APIError, invalid, shown

if TYPE_CHECKING:  # the tokenizer's module loads torch (GGUF vocabularies); this needs only its type
    from tropical.engine.tokenizer import Tokenizer

FIELD = "response_format"
ANY_OBJECT = {"type": "object"}
"""What ``json_object`` asks for, as vLLM compiles it."""


class GrammarError(ValueError):
    """The grammar cannot go on: a token it refuses was sampled, or llguidance failed inside.
    Fails the one request, not the server."""


@dataclass(frozen=True)
class GrammarVocabulary:
    """llguidance's view of the model's vocabulary, built once per server (0.3 s on SmolLM2);
    ``words``: 32-bit words per mask, covering the model's logits (which may be wider than the
    tokenizer: its padding ids are never allowed)."""

    tokenizer: LLTokenizer
    words: int

    @classmethod
    def of(cls, tokenizer: Tokenizer, vocab_size: int | None = None) -> GrammarVocabulary:
        """``vocab_size``: the model's logits width (default: the tokenizer's vocabulary)."""
        size = tokenizer.vocab_size if vocab_size is None else vocab_size
        if size < tokenizer.vocab_size:
            raise ValueError(f"the model's vocabulary ({size} tokens) is smaller than its "
                             f"tokenizer's ({tokenizer.vocab_size})")
        eos = list(tokenizer.eos_token_ids) or None
        return cls(LLTokenizer(tokenizer.raw.to_str(), n_vocab=size, eos_token=eos), (size + 31) // 32)


@dataclass
class JsonMatcher:
    """One run's position in its grammar (a TokenConstraint): which tokens may come next, and
    each token sampled."""

    matcher: LLMatcher
    mask: np.ndarray

    def allowed(self) -> bytes:
        self.matcher.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.mask.nbytes)
        if self.matcher.is_error():
            raise GrammarError(f"{FIELD}: the grammar failed: {first_line(self.matcher.get_error())}")
        return self.mask.tobytes()

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise GrammarError(f"{FIELD}: token {token} does not follow the grammar: "
                               f"{first_line(self.matcher.get_error())}")


@dataclass(frozen=True)
class CompiledFormat:
    """A request's grammar, compiled; calling it gives a fresh matcher for one run of the request."""

    prototype: LLMatcher
    words: int

    def __call__(self) -> JsonMatcher:
        return JsonMatcher(self.prototype.deep_copy(), np.empty(self.words, dtype="<i4"))


def compile_format(value: Any, tokenizer: Tokenizer, vocab_size: int | None = None,
                   any_whitespace: bool = True) -> CompiledFormat | None:
    """The grammar of a ``response_format`` value, None for plain text; raises an APIError (400,
    naming response_format) when it is not a format or its schema is not one llguidance can follow.
    ``any_whitespace``: allow whitespace between JSON tokens, as vLLM does by default; False is
    vLLM's ``disable_any_whitespace`` (compact JSON: a weak model cannot loop on whitespace)."""
    schema = json_schema(value)
    if schema is None:
        return None
    vocabulary = grammar_vocabulary(tokenizer, vocab_size)
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": any_whitespace})
    except (ValueError, TypeError) as e:
        raise unusable(str(e)) from None
    matcher = LLMatcher(vocabulary.tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise unusable(first_line(matcher.get_error()))
    return CompiledFormat(matcher, vocabulary.words)


def json_schema(value: Any) -> dict[str, Any] | None:
    """The JSON Schema a ``response_format`` asks for (OpenAI's shapes), None for ``text``."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind != "json_schema":
        raise invalid(FIELD, f"response_format must be an object whose type is text, json_object or "
                             f"json_schema, got {shown(value)}")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid(FIELD, "response_format of type json_schema needs a json_schema object "
                             "holding its name and schema")
    if not isinstance(spec.get("name"), str):
        raise invalid(FIELD, f"response_format.json_schema.name must be a string, "
                             f"got {shown(spec.get('name'))}")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise invalid(FIELD, f"response_format.json_schema.schema must be a JSON Schema object, "
                             f"got {shown(schema)}")
    return schema


_VOCABULARIES: dict[tuple[int, int | None], tuple[weakref.ref[Tokenizer], GrammarVocabulary]] = {}


def grammar_vocabulary(tokenizer: Tokenizer, vocab_size: int | None = None) -> GrammarVocabulary:
    """``tokenizer``'s GrammarVocabulary, built on first use and kept while the tokenizer lives."""
    key = (id(tokenizer), vocab_size)
    held = _VOCABULARIES.get(key)
    if held is not None and held[0]() is tokenizer:
        return held[1]
    for dead in [k for k, (ref, _) in _VOCABULARIES.items() if ref() is None]:
        del _VOCABULARIES[dead]
    vocabulary = GrammarVocabulary.of(tokenizer, vocab_size)
    _VOCABULARIES[key] = (weakref.ref(tokenizer), vocabulary)
    return vocabulary


def unusable(reason: str) -> APIError:
    """A schema llguidance refuses: not JSON Schema, or keywords it cannot enforce (``uniqueItems``,
    ``not``, ``if``/``then``, ``contains``, ...; vLLM's guidance backend refuses them too)."""
    return invalid(FIELD, f"response_format's schema is not valid JSON Schema or uses keywords this server "
                          f"cannot enforce: {reason}")


def first_line(message: str) -> str:
    """llguidance's error without the parser state dump it appends."""
    return message.split("\n", 1)[0]

