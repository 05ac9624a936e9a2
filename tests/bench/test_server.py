"""Model discovery: the first served model, its context length, and an unreachable server."""

from __future__ import annotations

import pytest

from tests.bench.fake_server import MODEL, Script
from tropical.bench.server import Endpoint, ServedModel, served_model


def test_the_first_model_and_its_context_come_from_v1_models(fake_server):
    url = fake_server(Script(max_model_len=2048))
    assert served_model(Endpoint(url + "/v1/"), None) == ServedModel(MODEL, 2048)


def test_a_named_model_is_used_even_without_v1_models():
    assert served_model(Endpoint("http://127.0.0.1:1"), "mine", timeout=1) == ServedModel("mine")


def test_without_a_name_an_unreachable_server_is_a_clear_error():
    with pytest.raises(ValueError, match="pass --model"):
        served_model(Endpoint("http://127.0.0.1:1"), None, timeout=1)


def test_the_api_key_is_a_bearer_token():
    assert Endpoint("http://x", "k").headers == {"Authorization": "Bearer k"}
