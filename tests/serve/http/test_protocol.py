"""Request parsing refuses bad input field by field; the response builders fit the openai client's types."""

from __future__ import annotations

import json

import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tropical.serve.http.protocol import (
    SSE_DONE,
    APIError,
    Choice,
    GenerationRequest,
    completion_body,
    models_body,
    parse_chat,
    parse_completion,
    sse,
    stream_chunk,
    usage_chunk,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


def body(base: dict, **fields: object) -> bytes:
    return json.dumps({**base, **fields}).encode()


def refused(parse: object, raw: bytes, headers: dict[str, str] | None = None) -> APIError:
    with pytest.raises(APIError) as caught:
        parse(raw, headers or {})  # type: ignore[operator]
    assert caught.value.status == 400
    return caught.value


def test_completion_defaults_follow_openai() -> None:
    req = parse_completion(body(COMPLETION), {})
    assert req == GenerationRequest(model="m", chat=False, prompt="hi")
    assert req.temperature == 1.0 and req.top_p == 1.0 and req.stop == [] and not req.stream


def test_completion_reads_every_supported_field() -> None:
    raw = body(COMPLETION, prompt=[1, 2, 3], max_tokens=5, temperature=0, top_p=0.5, top_k=40, seed=7,
               stop="\n", ignore_eos=True, stream=True, stream_options={"include_usage": True},
               slo_ttft_ms=200, slo_tpot_ms=50.5, retry=False, n=1, logprobs=None, user="x",
               frequency_penalty=0)
    req = parse_completion(raw, {})
    assert req == GenerationRequest(
        model="m", chat=False, prompt=[1, 2, 3], max_tokens=5, temperature=0.0, top_p=0.5, top_k=40, seed=7,
        stop=["\n"], ignore_eos=True, stream=True, include_usage=True, slo_ttft_ms=200.0, slo_tpot_ms=50.5,
        retry=False,
    )


def test_chat_normalizes_text_parts_to_strings() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok", "name": "bot"},
    ]
    req = parse_chat(body(CHAT, messages=messages), {})
    assert req.chat and req.prompt == ""
    assert req.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"},
                            {"role": "assistant", "content": "ok"}]


def test_chat_max_completion_tokens_wins_over_max_tokens() -> None:
    assert parse_chat(body(CHAT, max_tokens=9, max_completion_tokens=3), {}).max_tokens == 3
    assert parse_chat(body(CHAT, max_tokens=9), {}).max_tokens == 9


@pytest.mark.parametrize("raw", [b"{", b"", b"\xff\xfe", b"not json"])
def test_malformed_json_is_a_400_saying_so(raw: bytes) -> None:
    error = refused(parse_completion, raw)
    assert "not valid JSON" in error.message and error.param is None


@pytest.mark.parametrize("raw", [b"[]", b"1", b'"x"', b"null"])
def test_a_body_that_is_not_an_object_is_refused(raw: bytes) -> None:
    assert "JSON object" in refused(parse_chat, raw).message


@pytest.mark.parametrize(("fields", "param"), [
    ({"model": None}, "model"),
    ({"model": 3}, "model"),
    ({"model": ""}, "model"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.1}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"seed": "1"}, "seed"),
    ({"n": 0}, "n"),
    ({"n": 1.5}, "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": ""}, "stop"),
    ({"stop": ["a", ""]}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"stop": {"a": 1}}, "stop"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"retry": 0}, "retry"),
    ({"stream": 1}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": []}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
    ({"slo_ttft_ms": 0}, "slo_ttft_ms"),
    ({"slo_ttft_ms": "fast"}, "slo_ttft_ms"),
    ({"slo_tpot_ms": -5}, "slo_tpot_ms"),
    ({"slo_tpot_ms": 10**400}, "slo_tpot_ms"),
    ({"temperature": float("nan")}, "temperature"),
])
def test_bad_shared_fields_name_the_field(fields: dict, param: str) -> None:
    for parse, base in ((parse_completion, COMPLETION), (parse_chat, CHAT)):
        error = refused(parse, body(base, **fields))
        assert error.param == param and error.type == "invalid_request_error"
        assert param in error.message


@pytest.mark.parametrize("prompt", [["a", "b"], ["a"], [[1, 2], [3]], [[1, 2]]])
def test_batched_prompts_are_refused_clearly(prompt: list) -> None:
    error = refused(parse_completion, body(COMPLETION, prompt=prompt))
    assert error.param == "prompt" and "batched prompts" in error.message


@pytest.mark.parametrize("prompt", [None, "", [], [1, -2], [1, "a"], [True], 5, {"text": "a"}])
def test_a_prompt_must_be_text_or_token_ids(prompt: object) -> None:
    error = refused(parse_completion, body(COMPLETION, prompt=prompt))
    assert error.param == "prompt" and "string or a list of token ids" in error.message


@pytest.mark.parametrize(("messages", "param"), [
    (None, "messages"),
    ([], "messages"),
    ("hi", "messages"),
    (["hi"], "messages[0]"),
    ([{"content": "hi"}], "messages[0].role"),
    ([{"role": "user", "content": "a"}, {"role": "wizard", "content": "hi"}], "messages[1].role"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": 3}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[0].content[0]"),
    ([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text"}]}],
     "messages[0].content[1]"),
])
def test_bad_messages_name_the_message(messages: object, param: str) -> None:
    assert refused(parse_chat, body(CHAT, messages=messages)).param == param


def test_slo_headers_are_read_case_insensitively() -> None:
    req = parse_completion(body(COMPLETION), {"X-SLO-TTFT-MS": "250", "x-slo-tpot-ms": "40.5"})
    assert (req.slo_ttft_ms, req.slo_tpot_ms) == (250.0, 40.5)


def test_body_slo_wins_over_the_header() -> None:
    req = parse_chat(body(CHAT, slo_ttft_ms=100), {"x-slo-ttft-ms": "nonsense"})
    assert req.slo_ttft_ms == 100.0 and req.slo_tpot_ms is None


@pytest.mark.parametrize("value", ["fast", "0", "-3", "nan", "inf", ""])
def test_a_bad_slo_header_is_refused_by_name(value: str) -> None:
    error = refused(parse_completion, body(COMPLETION), {"x-slo-tpot-ms": value})
    assert error.param == "x-slo-tpot-ms"


def test_top_k_zero_or_minus_one_disables_it() -> None:
    assert parse_completion(body(COMPLETION, top_k=0), {}).top_k is None
    assert parse_completion(body(COMPLETION, top_k=-1), {}).top_k is None


def test_error_body_has_openai_shape() -> None:
    error = APIError(401, "bad key", type="authentication_error", code="invalid_api_key")
    assert error.body() == {"error": {"message": "bad key", "type": "authentication_error", "param": None,
                                      "code": "invalid_api_key"}}
    assert str(error) == "bad key"


def test_an_overlong_bad_value_is_cut_short_in_the_message() -> None:
    error = refused(parse_completion, body(COMPLETION, temperature="x" * 10_000))
    assert len(error.message) < 200


def test_completion_body_is_an_openai_completion() -> None:
    raw = completion_body("cmpl-1", "m", 5, [Choice("hello", "stop")], 3, 2, chat=False)
    out = Completion.model_validate(raw)
    assert out.object == "text_completion" and out.choices[0].text == "hello"
    assert out.choices[0].finish_reason == "stop"
    assert out.usage is not None and out.usage.total_tokens == 5


def test_chat_body_is_an_openai_chat_completion() -> None:
    raw = completion_body("chatcmpl-1", "m", 5, [Choice("hi", "length")], 3, 1, chat=True)
    out = ChatCompletion.model_validate(raw)
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == "hi"
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (3, 1)


def test_chat_chunks_carry_the_role_first_and_finish_last() -> None:
    first = ChatCompletionChunk.model_validate(stream_chunk("c", "m", 5, "", None, chat=True, first=True))
    middle = ChatCompletionChunk.model_validate(stream_chunk("c", "m", 5, "lo", None, chat=True, first=False))
    last = ChatCompletionChunk.model_validate(stream_chunk("c", "m", 5, "", "stop", chat=True, first=False))
    assert first.object == "chat.completion.chunk"
    assert (first.choices[0].delta.role, first.choices[0].delta.content) == ("assistant", "")
    assert (middle.choices[0].delta.role, middle.choices[0].delta.content) == (None, "lo")
    assert last.choices[0].delta.content is None and last.choices[0].finish_reason == "stop"


def test_completion_chunks_are_openai_completions() -> None:
    last = stream_chunk("c", "m", 5, "x", "length", chat=False, first=False)
    assert Completion.model_validate(last).choices[0].finish_reason == "length"
    middle = stream_chunk("c", "m", 5, "x", None, chat=False, first=True)
    # OpenAI streams null finish reasons until the end; the client reads chunks without validating that field
    assert middle["choices"][0] == {**last["choices"][0], "finish_reason": None}


@pytest.mark.parametrize("chat", [True, False])
def test_chunks_say_how_many_tokens_they_carry_as_an_extension_clients_ignore(chat: bool) -> None:
    chunk = stream_chunk("c", "m", 5, "", "length", chat=chat, first=False, tokens=2)
    assert chunk["choices"][0]["tokens"] == 2
    kind = ChatCompletionChunk if chat else Completion
    assert kind.model_validate(chunk).choices[0].finish_reason == "length"


@pytest.mark.parametrize(("chat", "kind"), [(True, ChatCompletionChunk), (False, Completion)])
def test_usage_chunk_has_no_choices(chat: bool, kind: type) -> None:
    out = kind.model_validate(usage_chunk("c", "m", 5, 4, 6, chat=chat))
    assert out.choices == [] and out.usage.total_tokens == 10


def test_sse_frames_one_json_event() -> None:
    frame = sse({"a": "é"})
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    assert json.loads(frame[len(b"data: "):]) == {"a": "é"}
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_models_body_lists_openai_models() -> None:
    out = models_body(["tiny-random"], 1024, created=7)
    assert out["object"] == "list"
    model = Model.model_validate(out["data"][0])
    assert (model.id, model.object, model.owned_by, model.created) == ("tiny-random", "model", "tropical", 7)
    assert out["data"][0]["max_model_len"] == 1024


@pytest.mark.parametrize(("raw", "param", "says"), [
    (b'{"model": "m", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "max_tokens", "digits"),
    (b'{"model": "m", "prompt": [' * 1 + b"[" * 100_000 + b"]" * 100_001 + b"}", "prompt", "deeply"),
    (b'{"model": "m", "stop": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}", "stop", "deeply"),
    (b"[" * 100_000 + b"]" * 100_000, None, "the request body"),
])
def test_json_python_cannot_hold_is_a_400_naming_the_field(raw: bytes, param: str | None, says: str) -> None:
    error = refused(parse_completion, raw)
    assert error.param == param and says in error.message


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"model": "m", "prompt": "a\\ud800b"}', "prompt"),
    (b'{"model": "m", "prompt": "hi", "stop": ["\\udc00"]}', "stop"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(raw: bytes, param: str) -> None:
    assert refused(parse_completion, raw).param == param


def test_a_lone_surrogate_in_a_message_names_messages() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'
    assert refused(parse_chat, raw).param == "messages"


def test_a_surrogate_pair_is_text() -> None:
    assert parse_completion(b'{"model": "m", "prompt": "\\ud83d\\ude00"}', {}).prompt == "\U0001f600"


@pytest.mark.parametrize(("fields", "param"), [
    ({"best_of": 2}, "best_of"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"suffix": "x"}, "suffix"),
])
def test_unsupported_openai_fields_are_refused_by_name(fields: dict, param: str) -> None:
    error = refused(parse_chat, body(CHAT, **fields))
    assert error.param == param and "not supported" in error.message


@pytest.mark.parametrize("fields", [{"best_of": 1}, {"tools": []}, {"suffix": ""}])
def test_unsupported_fields_that_ask_for_nothing_are_accepted(fields: dict) -> None:
    assert parse_chat(body(CHAT, **fields), {}).chat
