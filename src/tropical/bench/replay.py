"""Replay planned requests at their send times over one shared HTTP client, with a progress bar."""

from __future__ import annotations

import asyncio
import sys
import time

import httpx
from tqdm import tqdm

from tropical.bench.plan import PlannedRequest
from tropical.bench.prompts import prompt
from tropical.bench.record import Measurement
from tropical.bench.server import Endpoint
from tropical.bench.stream import measure


def completion_body(req: PlannedRequest, model: str, fmt: str, seed: int) -> dict:
    """A streamed completion that must generate exactly the trace's output length."""
    return {"model": model, "prompt": prompt(req, fmt, seed), "max_tokens": req.output_len,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "temperature": 0.0}


async def replay(planned: list[PlannedRequest], endpoint: Endpoint, model: str, fmt: str,
                 seed: int, timeout: float) -> list[Measurement]:
    """Send each request at its ``send_at`` (open loop: late answers never delay later sends)."""
    # No connection cap: a pool limit would queue requests in the client and inflate TTFT.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=endpoint.base, headers=endpoint.headers, limits=limits,
                                 timeout=httpx.Timeout(timeout)) as client:
        with tqdm(total=len(planned), unit="req", file=sys.stderr, desc="bench") as bar:
            start = time.perf_counter()  # after setting up the client, which takes tens of ms

            def clock() -> float:
                return time.perf_counter() - start

            tasks = []
            for req in planned:
                await asyncio.sleep(max(0.0, req.send_at - clock()))
                body = completion_body(req, model, fmt, seed)
                m = Measurement(req.id, req.prompt_len, req.output_len)
                task = asyncio.create_task(measure(client, body, m, clock, timeout))
                task.add_done_callback(lambda _: bar.update())
                tasks.append(task)
            return list(await asyncio.gather(*tasks))
