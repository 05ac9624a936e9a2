"""generate() applies the sampling features as a worker does: a stop token id ends the text
(dropped, like an eos), min_tokens holds it off, a logit bias steers greedy decoding."""

from __future__ import annotations

import pytest

from tropical.core.sampling import SamplingParams
from tropical.engine.generate import generate
from tropical.engine.loader import LoadedModel, load_model

PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model("tiny-random", cache_dir=tmp_path_factory.mktemp("cache"))


def test_stop_token_ids_min_tokens_and_bias_steer_generate(tiny: LoadedModel) -> None:
    free = generate(tiny, PROMPT, max_tokens=8, chat=False).token_ids
    stop = free[2]
    stopped = generate(tiny, PROMPT, max_tokens=8, chat=False,
                       sampling=SamplingParams(stop_token_ids=(stop,)))
    assert stopped.finish_reason == "stop" and stopped.token_ids == free[:free.index(stop)]
    held = generate(tiny, PROMPT, max_tokens=8, chat=False,
                    sampling=SamplingParams(stop_token_ids=(stop,), min_tokens=8))
    assert held.finish_reason == "length" and stop not in held.token_ids
    biased = generate(tiny, PROMPT, max_tokens=3, chat=False,
                      sampling=SamplingParams(logit_bias=((42, 100.0),)))
    assert biased.token_ids == [42, 42, 42]
