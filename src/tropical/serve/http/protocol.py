"""The OpenAI wire format: parse /v1/completions and /v1/chat/completions bodies, build the responses.

Pure functions over bytes and dicts, so every rule about bad input is testable without a server. Errors
name the offending field in `param`, the way OpenAI's API does. Fields we do not know are ignored, since
real clients send many; OpenAI fields we know but do not implement are refused when they ask for
something (`UNSUPPORTED`), since ignoring them would answer a different question than the one asked.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tropical.serve.http.sampling_fields import SamplingFields, sampling_fields
from tropical.serve.http.values import APIError, boolean, integer, invalid, is_int, is_number, number, shown

ROLES = ("system", "developer", "user", "assistant")
MAX_STOPS = 4
SSE_DONE = b"data: [DONE]\n\n"
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
"""A JSON escape of a UTF-16 surrogate: only bodies with one can hold a lone surrogate."""
WHITESPACE = re.compile(r"[ \t\n\r]*")
DECODER = json.JSONDecoder()
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1), "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"),
    "functions": (None, []), "function_call": (None, "none"),
}
"""OpenAI fields this server does not implement, with the values that ask for nothing."""


@dataclass(frozen=True)
class GenerationRequest:
    """One validated request; `prompt` is empty for chat, whose `messages` the router renders."""

    model: str
    chat: bool
    prompt: str | list[int]
    messages: list[dict] | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    retry: bool = True
    sampling: SamplingFields = field(default_factory=SamplingFields)


def parse_completion(body: bytes, headers: Mapping[str, str]) -> GenerationRequest:
    """A /v1/completions body: one prompt, as text or token ids."""
    data = load_body(body)
    return build_request(data, headers, chat=False, prompt=completion_prompt(data.get("prompt")))


def parse_chat(body: bytes, headers: Mapping[str, str]) -> GenerationRequest:
    """A /v1/chat/completions body: messages with text content, normalized to strings."""
    data = load_body(body)
    return build_request(data, headers, chat=True, prompt="", messages=chat_messages(data.get("messages")))


def load_body(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from e
    except (ValueError, RecursionError) as e:
        raise unholdable(body, e) from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    if SURROGATE_ESCAPE.search(body):
        check_surrogates(data)
    return data


def unholdable(body: bytes, error: ValueError | RecursionError) -> APIError:
    """Valid JSON that Python will not hold: an integer of thousands of digits, or nesting deeper
    than the recursion limit. Named by the top-level field it sits in, found by parsing field by field."""
    param = failing_field(body.decode("utf-8", errors="replace"))
    where = param or "the request body"
    if isinstance(error, RecursionError):
        return APIError(400, f"{where} nests arrays or objects too deeply", param=param)
    limit = sys.get_int_max_str_digits()
    return APIError(400, f"{where} holds an integer of more than {limit} digits", param=param)


def failing_field(text: str) -> str | None:
    """The key of the first top-level field whose value fails to parse (None if none does, or the
    body is not an object)."""
    pos = skip_whitespace(text, 0)
    if not text.startswith("{", pos):
        return None
    while text[pos:pos + 1] in ("{", ","):
        key = None
        try:
            key, pos = DECODER.raw_decode(text, skip_whitespace(text, pos + 1))
            pos = skip_whitespace(text, pos)
            _, pos = DECODER.raw_decode(text, skip_whitespace(text, pos + 1))
        except (ValueError, RecursionError):
            return key if isinstance(key, str) else None
        pos = skip_whitespace(text, pos)
    return None


def skip_whitespace(text: str, pos: int) -> int:
    """The position after the JSON whitespace at ``pos`` (WHITESPACE matches the empty string
    too, so it matches everywhere)."""
    match = WHITESPACE.match(text, pos)
    assert match is not None
    return match.end()


def check_surrogates(data: dict[str, Any]) -> None:
    """A lone surrogate ("\\ud800") parses, but no tokenizer or UTF-8 reply can carry it."""
    for name, value in data.items():
        try:
            json.dumps([name, value], ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise invalid(name, f"{name} holds a lone UTF-16 surrogate, which is not text") from None


def build_request(
    data: dict[str, Any], headers: Mapping[str, str], chat: bool, prompt: str | list[int],
    messages: list[dict] | None = None,
) -> GenerationRequest:
    """The fields both endpoints share, each checked by its own rule."""
    check_unsupported(data)
    stream = boolean(data, "stream", False)
    return GenerationRequest(
        model=model_name(data.get("model")),
        chat=chat,
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens(data, chat),
        temperature=number(data, "temperature", 1.0, lambda x: 0 <= x <= 2, "a number in [0, 2]"),
        top_p=number(data, "top_p", 1.0, lambda x: 0 < x <= 1, "a number in (0, 1]"),
        top_k=top_k(data.get("top_k")),
        seed=integer(data, "seed", None, "an integer"),
        stop=stop_strings(data.get("stop")),
        ignore_eos=boolean(data, "ignore_eos", False),
        stream=stream,
        include_usage=include_usage(data.get("stream_options"), stream),
        slo_ttft_ms=slo_ms(data, headers, "slo_ttft_ms", "x-slo-ttft-ms"),
        slo_tpot_ms=slo_ms(data, headers, "slo_tpot_ms", "x-slo-tpot-ms"),
        retry=boolean(data, "retry", True),
        sampling=sampling_fields(data, chat),
    )


def model_name(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise invalid("model", "model is required and must be a non-empty string")
    return value


def check_unsupported(data: dict[str, Any]) -> None:
    for name, harmless in UNSUPPORTED.items():
        value = data.get(name)
        if not any(value == h and type(value) is type(h) for h in harmless):
            raise invalid(name, f"{name} is not supported by this server, got {shown(value)}; leave it "
                                f"out (or send {shown(harmless[-1])})")


def max_tokens(data: dict[str, Any], chat: bool) -> int | None:
    """Chat clients may send the newer `max_completion_tokens`; it wins over `max_tokens`."""
    name = "max_completion_tokens" if chat and data.get("max_completion_tokens") is not None else "max_tokens"
    return integer(data, name, 1, "a positive integer")


def top_k(value: Any) -> int | None:
    """An extension; 0 and -1 mean no top-k, as in vLLM."""
    if value is None or (is_int(value) and value in (0, -1)):
        return None
    return integer({"top_k": value}, "top_k", 1, "a positive integer (or 0 or -1 to disable it)")


def stop_strings(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if stops is None:
        return []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("stop", f"stop must be a non-empty string or a list of them, got {shown(value)}")
    if len(stops) > MAX_STOPS:
        raise invalid("stop", f"stop takes at most {MAX_STOPS} strings, got {len(stops)}")
    return list(stops)


def include_usage(options: Any, stream: bool) -> bool:
    if options is None:
        return False
    if not stream:
        raise invalid("stream_options", "stream_options is only allowed when stream is true")
    if not isinstance(options, dict):
        raise invalid("stream_options", f"stream_options must be an object, got {shown(options)}")
    return boolean(options, "include_usage", False, within="stream_options.")


def slo_ms(data: dict[str, Any], headers: Mapping[str, str], name: str, header: str) -> float | None:
    """A per-request SLO in milliseconds from the body or, failing that, a header."""
    if data.get(name) is not None:
        return positive_ms(data[name], name)
    raw = next((v for k, v in headers.items() if k.lower() == header), None)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    return positive_ms(value, header)


def positive_ms(value: Any, param: str) -> float:
    if not is_number(value) or value <= 0:
        raise invalid(param, f"{param} must be a positive number of milliseconds, got {shown(value)}")
    return float(value)


def completion_prompt(value: Any) -> str | list[int]:
    """One prompt: text or token ids. Batches (lists of strings or of id lists) are refused, as n is 1."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(is_int(t) and t >= 0 for t in value):
        return list(value)
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        raise invalid("prompt", "batched prompts (a list of strings or of token lists) are not supported: "
                                "send one prompt per request, as a string or a list of token ids")
    raise invalid("prompt", f"prompt must be a non-empty string or a list of token ids, got {shown(value)}")


def chat_messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise invalid("messages", "messages must be a non-empty list of {role, content} objects")
    return [chat_message(m, f"messages[{i}]") for i, m in enumerate(value)]


def chat_message(message: Any, where: str) -> dict:
    if not isinstance(message, dict):
        raise invalid(where, f"{where} must be an object with role and content")
    role = message.get("role")
    if role not in ROLES:
        raise invalid(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}, got {shown(role)}")
    return {"role": role, "content": message_content(message.get("content"), f"{where}.content")}


def message_content(content: Any, where: str) -> str:
    """A string, or text parts joined by newlines as vLLM does; other part types are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(where, f"{where} must be a string or a list of text parts, got {shown(content)}")
    return "\n".join(text_part(part, f"{where}[{i}]") for i, part in enumerate(content))


def text_part(part: Any, where: str) -> str:
    if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        raise invalid(where, f"{where} must be a {{\"type\": \"text\", \"text\": ...}} part "
                             f"(only text is supported), got {shown(part)}")
    return part["text"]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """OpenAI's usage; ``cached_tokens``: prompt tokens found in the prefix cache, not computed."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def envelope(request_id: str, model: str, created: int, obj: str, choices: list[dict]) -> dict:
    return {"id": request_id, "object": obj, "created": created, "model": model, "choices": choices}


@dataclass(frozen=True)
class Choice:
    """One finished choice of a whole response; ``logprobs`` in its endpoint's wire shape."""

    text: str
    finish_reason: str
    logprobs: dict | None = None


def completion_body(
    request_id: str, model: str, created: int, choices: list[Choice], prompt_tokens: int,
    completion_tokens: int, chat: bool, cached_tokens: int = 0,
) -> dict:
    """A whole non-streaming response: its choices, indexed in order, and the usage of all of
    them (the prompt counted once, as OpenAI counts it)."""
    body = envelope(request_id, model, created, "chat.completion" if chat else "text_completion",
                    [choice_body(i, c, chat) for i, c in enumerate(choices)])
    body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
    return body


def choice_body(index: int, choice: Choice, chat: bool) -> dict:
    body: dict[str, Any] = {"index": index, "logprobs": choice.logprobs,
                            "finish_reason": choice.finish_reason}
    if chat:
        body["message"] = {"role": "assistant", "content": choice.text}
    else:
        body["text"] = choice.text
    return body


def stream_chunk(
    request_id: str, model: str, created: int, text: str, finish_reason: str | None, chat: bool, first: bool,
    tokens: int = 1, index: int = 0, logprobs: dict | None = None,
) -> dict:
    """One streamed piece of choice ``index``; its first chat chunk names the role, an empty final
    one carries no content. ``tokens``, the completion tokens behind the piece, is an extension
    OpenAI clients ignore."""
    choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish_reason,
                              "tokens": tokens}
    if chat:
        delta: dict[str, str] = {"role": "assistant"} if first else {}
        if text or first:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text
    return envelope(request_id, model, created, chunk_object(chat), [choice])


def usage_chunk(
    request_id: str, model: str, created: int, prompt_tokens: int, completion_tokens: int, chat: bool,
    cached_tokens: int = 0,
) -> dict:
    """The last chunk when stream_options.include_usage is set: no choices, only usage."""
    body = envelope(request_id, model, created, chunk_object(chat), [])
    body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
    return body


def chunk_object(chat: bool) -> str:
    return "chat.completion.chunk" if chat else "text_completion"


def sse(data: dict) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def models_body(model_ids: list[str], max_model_len: int, created: int = 0) -> dict:
    """The /v1/models listing; `created` is when the server loaded them (Unix seconds)."""
    data = [{"id": m, "object": "model", "created": created, "owned_by": "tropical",
             "max_model_len": max_model_len} for m in model_ids]
    return {"object": "list", "data": data}
