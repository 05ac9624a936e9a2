"""Responses with n choices, logprobs and echo, through the HTTP layer over a scripted router: each
body and chunk is checked with the openai client's own types, and the values with vLLM's layout."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.factories import make_request
from tropical.core.sampling import TokenLogprobs
from tropical.engine.loader import load_model
from tropical.engine.tokenizer import Tokenizer
from tropical.serve.http.app import ServerState, add_routes
from tropical.serve.http.prompts import Limits
from tropical.serve.streams import Event, RequestHandle, Submission

OUTPUT = [5, 9, 7]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return load_model("tiny-random").tokenizer


def entry(token: int, k: int) -> TokenLogprobs:
    """A made-up but consistent position: the token is the most likely, alternatives descend."""
    top = tuple((token + i, -0.5 - i) for i in range(k))
    return TokenLogprobs(token, -0.5, 1, top)


class ScriptedRouter:
    """Answers every submission with OUTPUT, one event per token, with logprobs when asked."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.submitted: list[Submission] = []
        self.aborted: list[int] = []

    def submit(self, submission: Submission) -> RequestHandle:
        rid = len(self.submitted)
        self.submitted.append(submission)
        req = make_request(rid, prompt=len(submission.prompt_ids), output=len(OUTPUT))
        handle = RequestHandle.of(req, submission, self.tokenizer)
        k = submission.params.logprobs
        prompt_k = submission.params.prompt_logprobs
        for i, token in enumerate(OUTPUT):
            handle.completion_tokens += 1
            prompt = None
            if i == 0 and prompt_k is not None:
                prompt = [None] + [entry(t, prompt_k) for t in submission.prompt_ids[1:]]
            handle.events.put_nowait(Event(
                self.tokenizer.decode([token + rid]), 1, "length" if i == len(OUTPUT) - 1 else None,
                logprobs=[entry(token + rid, k)] if k is not None else [], prompt_logprobs=prompt))
        handle.ended = True
        return handle

    def abort(self, rid: int) -> None:
        self.aborted.append(rid)


def serve(tokenizer: Tokenizer, limits: Limits | None = None) -> tuple[TestClient, ScriptedRouter]:
    router = ScriptedRouter(tokenizer)
    app = FastAPI()
    add_routes(app, ServerState(model_id="m", router=router, limits=limits or Limits()))  # type: ignore[arg-type]
    return TestClient(app), router


def chunks(reply: object) -> list[dict]:
    lines = reply.text.splitlines()  # type: ignore[attr-defined]
    assert lines[-2] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def test_completion_logprobs_list_each_token_with_k_alternatives_and_offsets(tokenizer: Tokenizer) -> None:
    client, _ = serve(tokenizer)
    ask = {"model": "m", "prompt": "hi", "max_tokens": 3, "logprobs": 2}
    lp = Completion.model_validate(client.post("/v1/completions", json=ask).json()).choices[0].logprobs
    assert lp is not None and lp.tokens == [tokenizer.decode([t], skip_special_tokens=False) for t in OUTPUT]
    assert lp.token_logprobs == [-0.5] * 3
    assert lp.top_logprobs is not None and all(len(top) == 2 for top in lp.top_logprobs)  # chosen = top 1
    lengths = [len(t) for t in lp.tokens]
    assert lp.text_offset == [0, lengths[0], lengths[0] + lengths[1]]


def test_echo_returns_the_prompt_with_its_logprobs_first_none(tokenizer: Tokenizer) -> None:
    client, router = serve(tokenizer)
    body = client.post("/v1/completions", json={"model": "m", "prompt": "hello there", "max_tokens": 3,
                                                "echo": True, "logprobs": 1}).json()
    prompt = router.submitted[0].prompt_ids
    assert router.submitted[0].params.prompt_logprobs == 1
    choice = body["choices"][0]
    assert choice["text"].startswith("hello there") and len(choice["text"]) > len("hello there")
    lp = choice["logprobs"]
    # null for the first prompt token, as vLLM and OpenAI send it; the client's types allow no null there
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["token_logprobs"]) == len(lp["tokens"]) == len(prompt) + 3
    assert all(len(top) == 1 for top in lp["top_logprobs"][1:])
    choice["logprobs"] = None
    Completion.model_validate(body)


def test_echo_without_logprobs_asks_for_no_prompt_logprobs(tokenizer: Tokenizer) -> None:
    client, router = serve(tokenizer)
    body = client.post("/v1/completions", json={"model": "m", "prompt": "hello", "echo": True}).json()
    assert body["choices"][0]["text"].startswith("hello") and body["choices"][0]["logprobs"] is None
    assert router.submitted[0].params.prompt_logprobs is None


def test_chat_logprobs_give_content_entries_with_bytes_and_k_top(tokenizer: Tokenizer) -> None:
    client, _ = serve(tokenizer)
    ask = {"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 3}
    body = client.post("/v1/chat/completions", json=ask).json()
    content = ChatCompletion.model_validate(body).choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 3
    for item, token in zip(content, OUTPUT, strict=True):
        assert item.bytes == list(item.token.encode()) and item.token == tokenizer.decode([token], False)
        assert [t.logprob for t in item.top_logprobs] == [-0.5, -1.5, -2.5]


def test_n_choices_share_usage_and_draw_from_distinct_seeds(tokenizer: Tokenizer) -> None:
    client, router = serve(tokenizer)
    body = client.post("/v1/completions", json={"model": "m", "prompt": "hi", "n": 3, "seed": 7,
                                                "temperature": 1}).json()
    out = Completion.model_validate(body)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({c.text for c in out.choices}) == 3  # the script shifts each request's tokens
    assert [s.params.seed for s in router.submitted] == [7, 8, 9]
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(router.submitted[0].prompt_ids), 9)


def test_streamed_n_choices_each_start_with_the_role_and_end_with_a_reason(tokenizer: Tokenizer) -> None:
    client, _ = serve(tokenizer)
    reply = client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2, "stream": True,
        "logprobs": True, "stream_options": {"include_usage": True}})
    got = chunks(reply)
    parsed = [ChatCompletionChunk.model_validate(c) for c in got]
    for index in (0, 1):
        mine = [c.choices[0] for c in parsed if c.choices and c.choices[0].index == index]
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason == "length"
        assert sum(len(c.logprobs.content or []) for c in mine if c.logprobs) == 3
    assert parsed[-1].usage is not None and parsed[-1].usage.completion_tokens == 6


def test_streamed_completion_logprobs_continue_their_text_offsets(tokenizer: Tokenizer) -> None:
    client, _ = serve(tokenizer)
    got = chunks(client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3,
                                                      "logprobs": 0, "stream": True}))
    offsets = [o for c in got for o in c["choices"][0]["logprobs"]["text_offset"]]
    tokens = [t for c in got for t in c["choices"][0]["logprobs"]["tokens"]]
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


@pytest.mark.parametrize(("fields", "param"), [
    ({"logprobs": 21}, "logprobs"),
    ({"n": 17}, "n"),
    ({"n": 2, "temperature": 0}, "n"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"stop_token_ids": [99999999]}, "stop_token_ids"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"echo": "yes"}, "echo"),
])
def test_refused_fields_are_a_400_naming_them_and_reach_no_worker(tokenizer: Tokenizer, fields: dict,
                                                                  param: str) -> None:
    client, router = serve(tokenizer)
    reply = client.post("/v1/completions", json={"model": "m", "prompt": "hi", **fields})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param
    assert router.submitted == []


def test_chat_top_logprobs_needs_logprobs_and_counts_against_the_limit(tokenizer: Tokenizer) -> None:
    client, router = serve(tokenizer, Limits(max_logprobs=2))
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    alone = client.post("/v1/chat/completions", json={**chat, "top_logprobs": 2})
    over = client.post("/v1/chat/completions", json={**chat, "logprobs": True, "top_logprobs": 3})
    assert [r.status_code for r in (alone, over)] == [400, 400]
    assert [r.json()["error"]["param"] for r in (alone, over)] == ["top_logprobs", "top_logprobs"]
    assert router.submitted == []


def test_sampling_controls_reach_the_engine_in_its_terms(tokenizer: Tokenizer) -> None:
    client, router = serve(tokenizer, Limits(processed_logprobs=True))
    client.post("/v1/completions", json={
        "model": "m", "prompt": "hi", "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "repetition_penalty": 1.2, "logit_bias": {"3": 150, "4": -2}, "min_tokens": 2,
        "stop_token_ids": [1, 2], "max_tokens": 5, "logprobs": 0})
    params = router.submitted[0].params
    assert params == replace(params, presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2,
                             logit_bias=((3, 100.0), (4, -2.0)), min_tokens=2, stop_token_ids=(1, 2),
                             logprobs=0, prompt_logprobs=None, processed_logprobs=True)
