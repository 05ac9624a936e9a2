"""The twin of a server whose processes served earlier runs: their prompts start in its prefix cache."""

from __future__ import annotations

import pytest

from tests.factories import linear_model
from tropical.bench.plan import PlannedRequest
from tropical.core.metrics import ttft
from tropical.core.slo import SLO
from tropical.fidelity.twin import ServerShape, simulate_twin

SLO_LOOSE = SLO(10.0, 1.0)
CACHED = ServerShape(kv_tokens=4096, block_size=16, max_model_len=512, max_batched_tokens=512,
                     workers="colocated", prefix_cache=True)
PROMPT = PlannedRequest(0, 0.0, 320, 4)


def first_request(warm: list[list[PlannedRequest]], shape: ServerShape = CACHED):
    return simulate_twin([PROMPT], SLO_LOOSE, "colocated", shape, linear_model(), warm=warm).requests[0]


def test_a_prompt_an_earlier_run_computed_starts_cached() -> None:
    cold, warm = first_request([]), first_request([[PROMPT]])
    assert cold.cached == 0
    assert warm.cached == 304                      # whole blocks, less the last token vLLM recomputes
    assert ttft(warm) < ttft(cold)


def test_other_prompts_warm_nothing() -> None:
    other = PlannedRequest(1, 0.0, 320, 4)         # another id: other tokens (bench.prompts)
    assert first_request([[other]]).cached == 0


def test_earlier_prompts_are_evicted_least_recently_used_first() -> None:
    """Later prompts overfill the 4,096-token cache: the oldest prompt goes first, tail first."""
    later = [PlannedRequest(i, 0.0, 480, 4) for i in range(1, 10)]
    assert first_request([[PROMPT, *later[:8]]]).cached == 256    # 64 tokens over: its tail left
    assert first_request([[PROMPT, *later]]).cached == 0
    assert first_request([[*later, PROMPT]]).cached == 304
    assert first_request([[PROMPT, *later[:8], PROMPT, later[8]]]).cached == 304


def test_no_warm_start_leaves_the_twin_as_it_was() -> None:
    planned = [PlannedRequest(i, 0.1 * i, 100 + 40 * i, 6) for i in range(6)]
    one = simulate_twin(planned, SLO_LOOSE, "chunked", CACHED, linear_model()).requests
    two = simulate_twin(planned, SLO_LOOSE, "chunked", CACHED, linear_model(), warm=[[]]).requests
    assert [(r.first_token, r.finish) for r in one] == [(r.first_token, r.finish) for r in two]


def test_a_warm_start_needs_the_prefix_cache_and_one_list_per_worker() -> None:
    bare = ServerShape(kv_tokens=4096, block_size=16, max_model_len=512, max_batched_tokens=512,
                       workers="colocated")
    with pytest.raises(ValueError, match="prefix cache"):
        first_request([[PROMPT]], bare)
    with pytest.raises(ValueError, match="warm prompts for 2"):
        first_request([[PROMPT], []])
