"""Planning: the simulator's rate scaling, and prompts fitted to the server's context."""

from __future__ import annotations

import pytest

from tropical.bench.plan import fit_context, plan_requests
from tropical.workload.trace import Trace, TraceEntry

TRACE = Trace("t", (TraceEntry(0.0, 1000, 10, (1, 2)), TraceEntry(2.0, 300, 40, (1,))))


def test_arrivals_are_divided_by_the_rate_scale_and_lengths_kept():
    planned = plan_requests(TRACE, rate_scale=4.0, max_model_len=None)
    assert [p.send_at for p in planned] == [0.0, 0.5]
    assert [(p.prompt_len, p.output_len, p.prefix_blocks) for p in planned] == [(1000, 10, (1, 2)),
                                                                              (300, 40, (1,))]
    assert not any(p.capped for p in planned)


def test_prompts_are_trimmed_to_fit_the_context_and_flagged():
    planned = plan_requests(TRACE, 1.0, max_model_len=500)
    assert [(p.prompt_len, p.output_len, p.capped) for p in planned] == [(490, 10, True), (300, 40, False)]


@pytest.mark.parametrize(("prompt", "output", "limit", "fitted"), [
    (100, 10, None, (100, 10)),
    (100, 10, 110, (100, 10)),
    (100, 10, 50, (40, 10)),
    (100, 80, 50, (1, 49)),
])
def test_fit_context_keeps_the_output_unless_it_alone_overflows(prompt, output, limit, fitted):
    assert fit_context(prompt, output, limit) == fitted
