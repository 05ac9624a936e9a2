"""`tropical serve` flags of the mock engine: each names what is wrong with it."""

from __future__ import annotations

import pytest

from tropical.serve.mock.model import mock_model
from tropical.serve.options import ServeOptions


@pytest.mark.parametrize(("flags", "message"), [
    ({"mock_time_scale": 0.5}, "--mock-time-scale set up mock workers: they need --engine mock"),
    ({"engine": "mock", "mock_cluster": "moon"}, "--mock-cluster must be one of paper, "),
    ({"engine": "mock", "mock_time_scale": 0.0}, "--mock-time-scale must be more than 0, got 0.0"),
])
def test_bad_mock_flags_are_named(flags: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ServeOptions(**flags)


def test_the_mock_is_one_replica_of_the_paper_cluster_by_default() -> None:
    model = mock_model(ServeOptions(engine="mock", max_model_len=300_000))
    assert model.name == "mock-internlm2-20b"
    assert model.max_model_len == model.config.max_position_embeddings  # the model's whole context
    assert model.num_blocks * model.block_size > 100_000  # two A100-80GB hold far more KV than one prompt
    assert "2x a100-80gb (paper)" in model.note


def test_another_preset_changes_the_model_and_its_speed() -> None:
    paper, small = (mock_model(ServeOptions(engine="mock", mock_cluster=c)) for c in ("paper", "small"))
    assert small.name == "mock-llama-2-7b"
    assert small.latency.decode_line(8) != paper.latency.decode_line(8)
