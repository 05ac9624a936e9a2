"""The OpenAI (and vLLM) fields that shape how tokens are chosen and what comes back with them:
choices (``n``), logprobs, echo, penalties, ``logit_bias``, ``min_tokens``, ``stop_token_ids`` and
``response_format``.

Checked here for what the wire format alone can tell (types, ranges, which field needs which);
limits that depend on the server (``--max-logprobs``, ``--max-n``, the vocabulary, the schema
compiler) are checked where the request meets the model (``prompts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tropical.serve.http.values import boolean, integer, invalid, is_int, is_number, number, shown

LOGIT_BIAS_LIMIT = 100.0
"""OpenAI's range for a logit bias; vLLM clamps a bias beyond it to it, and so do we."""
FORMAT_TYPES = ("text", "json_object", "json_schema")


@dataclass(frozen=True)
class SamplingFields:
    """``logprobs``: top alternatives to report per token (None: no logprobs; 0: only the chosen
    token's); ``echo``: the prompt comes back before the completion (with its logprobs when
    ``logprobs`` is set); ``logit_bias`` maps token ids to biases; ``response_format`` is the
    client's object, compiled against the tokenizer later (None: plain text)."""

    n: int = 1
    logprobs: int | None = None
    echo: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    response_format: dict[str, Any] | None = None


def sampling_fields(data: dict[str, Any], chat: bool) -> SamplingFields:
    """The fields of one body, each checked by its own rule."""
    return SamplingFields(
        n=integer(data, "n", 1, "a positive integer") or 1,
        logprobs=chat_logprobs(data) if chat else completion_logprobs(data),
        echo=False if chat else boolean(data, "echo", False),
        presence_penalty=penalty(data, "presence_penalty"),
        frequency_penalty=penalty(data, "frequency_penalty"),
        repetition_penalty=number(data, "repetition_penalty", 1.0, lambda x: x > 0,
                                  "a number > 0 (1: no penalty)"),
        logit_bias=logit_bias(data.get("logit_bias")),
        min_tokens=integer(data, "min_tokens", 0, "an integer >= 0") or 0,
        stop_token_ids=token_ids(data.get("stop_token_ids"), "stop_token_ids"),
        response_format=response_format(data.get("response_format")),
    )


def penalty(data: dict[str, Any], name: str) -> float:
    """A presence or frequency penalty: OpenAI's range."""
    return number(data, name, 0.0, lambda x: -2 <= x <= 2, "a number in [-2, 2]")


def completion_logprobs(data: dict[str, Any]) -> int | None:
    """/v1/completions: ``logprobs`` is the number of alternatives itself."""
    return integer(data, "logprobs", 0, "an integer >= 0 (the top alternatives per token)")


def chat_logprobs(data: dict[str, Any]) -> int | None:
    """/v1/chat/completions: ``logprobs`` switches them on, ``top_logprobs`` counts alternatives
    and, as in OpenAI's API, needs ``logprobs`` true."""
    wanted = boolean(data, "logprobs", False)
    top = integer(data, "top_logprobs", 0, "an integer >= 0")
    if top is not None and not wanted:
        raise invalid("top_logprobs", "top_logprobs needs logprobs set to true")
    return (top or 0) if wanted else None


def logit_bias(value: Any) -> dict[int, float]:
    """``{"token id": bias}``; ids are checked against the vocabulary once the model is known."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("logit_bias", f"logit_bias must be an object of token id -> bias, got {shown(value)}")
    biases = {}
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise invalid("logit_bias", f"logit_bias keys must be token ids (non-negative integers as "
                                        f"strings), got {shown(key)}")
        if not is_number(bias):
            raise invalid("logit_bias", f"logit_bias[{key}] must be a number, got {shown(bias)}")
        biases[int(key)] = max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, float(bias)))
    return biases


def token_ids(value: Any, name: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(is_int(t) and t >= 0 for t in value):
        raise invalid(name, f"{name} must be a list of token ids (integers >= 0), got {shown(value)}")
    return list(value)


def response_format(value: Any) -> dict[str, Any] | None:
    """The object's outer shape; its schema is compiled (and refused if it is not one) later."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in FORMAT_TYPES:
        raise invalid("response_format", f"response_format must be an object whose type is one of "
                                         f"{', '.join(FORMAT_TYPES)}, got {shown(value)}")
    return None if value["type"] == "text" else value
