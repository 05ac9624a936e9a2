"""The requests to send: the trace slice scaled in rate, fitted to the server's context."""

from __future__ import annotations

from dataclasses import dataclass

from tropical.workload.trace import Trace
from tropical.workload.transform import scale_rate


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of the replay; ``send_at`` is seconds after the run starts."""

    id: int
    send_at: float
    prompt_len: int
    output_len: int
    prefix_blocks: tuple[int, ...] = ()
    capped: bool = False


def plan_requests(trace: Trace, rate_scale: float, max_model_len: int | None) -> list[PlannedRequest]:
    """The trace slice's requests (lengths already scaled and bounded) as the client will send them:
    arrivals scaled as the simulator scales them, prompts fitted to the server's context."""
    scaled = scale_rate(trace, rate_scale)
    planned = []
    for i, e in enumerate(scaled.entries):
        prompt, output = fit_context(e.input_len, e.output_len, max_model_len)
        planned.append(PlannedRequest(i, e.arrival, prompt, output, e.prefix_blocks,
                                      (prompt, output) != (e.input_len, e.output_len)))
    return planned


def fit_context(prompt: int, output: int, max_model_len: int | None) -> tuple[int, int]:
    """Prompt and output lengths with prompt + output <= ``max_model_len`` (None: unchanged).

    The prompt is trimmed first: the output length is the denominator of TPOT, so keeping it
    keeps the decode work the trace asks for. Only an output that alone overflows is cut.
    """
    if max_model_len is None or prompt + output <= max_model_len:
        return prompt, output
    output = min(output, max_model_len - 1)
    return max(1, max_model_len - output), output
