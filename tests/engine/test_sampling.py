"""Sampling at the edges of its parameters: temperatures so small that dividing by them overflows."""

from __future__ import annotations

import pytest
import torch

from tropical.core.sampling import GREEDY_BELOW, SamplingParams
from tropical.engine.sampling import sample, step_generator


@pytest.mark.parametrize("temperature", [5e-324, 1e-40, 1e-38, GREEDY_BELOW / 2])
def test_tiny_temperatures_sample_greedily_instead_of_failing(temperature: float) -> None:
    logits = torch.randn(4, 128, generator=torch.Generator().manual_seed(7))
    params = [SamplingParams(temperature=temperature, seed=3) for _ in range(4)]
    assert sample(logits, params, [step_generator(p, 0) for p in params]) == logits.argmax(-1).tolist()


def test_the_smallest_sampled_temperature_still_samples() -> None:
    assert not SamplingParams(temperature=GREEDY_BELOW).greedy
    logits = torch.randn(1, 128, generator=torch.Generator().manual_seed(7)) * 1e3
    params = SamplingParams(temperature=GREEDY_BELOW, seed=3)
    assert sample(logits, [params], [step_generator(params, 0)]) == logits.argmax(-1).tolist()
