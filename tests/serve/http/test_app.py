"""The HTTP layer without workers: body limits and error shapes, through Starlette's test client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tropical.serve.http.app import ServerState, add_routes

BODY = b'{"model": "m", "prompt": "' + b"a" * 3000 + b'"}'


class BrokenRouter:
    """A router whose every use fails, as a bug would."""

    draining = False

    def __getattr__(self, name: str) -> object:
        raise RuntimeError(f"no {name} here")


def client(limit: int = 1024) -> TestClient:
    app = FastAPI()
    add_routes(app, ServerState(model_id="m", max_body_bytes=limit, router=BrokenRouter()))  # type: ignore[arg-type]
    return TestClient(app, raise_server_exceptions=False)


def chunks(body: bytes, size: int = 100) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start:start + size]


@pytest.mark.parametrize("send", [lambda: BODY, lambda: chunks(BODY)], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_is_413_whether_its_length_is_declared_or_not(send: object) -> None:
    reply = client().post("/v1/completions", content=send(), headers={"content-type": "application/json"})
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == "request_too_large"


def test_a_bug_answers_500_in_openai_shape_without_details() -> None:
    reply = client(limit=10_000).post("/v1/completions", content=BODY)
    assert reply.status_code == 500
    error = reply.json()["error"]
    assert error["message"] == "internal server error (RuntimeError)" and error["type"] == "server_error"
