"""Count the steps of one iteration's decision path: from ``Router._step`` to the toggle's decision.

A step is a call into a function of ``src/tropical`` or a return from one, made by the stepping
worker's task between entering ``Router._step`` and entering ``TropicalPolicy.on_iteration_end``
(a coroutine resumed after an await is no new call, one suspended at an await no return). The
scenario is fixed: policy tropical on two fake workers (prefill, multiplex) on a virtual clock
(``tests/serve/fake_cluster.py``), two 400-token prompts; the first iteration the router runs is
traced. Also printed: the distinct functions and files on the path, the steps that cross from one
file into another (the ping-pong between modules) and the steps taken in serve/.

    .venv/bin/python benchmarks/decision_steps.py [-v]     (-v: the path itself)
"""

from __future__ import annotations

import asyncio
import dis
import os
import sys
from types import CodeType, FrameType
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.factories import linear_cluster  # noqa: E402
from tests.serve.fake_cluster import VirtualLoop, run_virtual, start_router, submission  # noqa: E402
from tropical.core.request import Request  # noqa: E402
from tropical.core.slo import SLO  # noqa: E402
from tropical.sched.registry import make_policy  # noqa: E402

SRC = os.path.dirname(os.path.abspath(sys.modules["tropical"].__file__ or ""))
GENERATOR = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async generator
START, TOGGLE = ("serve/router.py", "_step"), ("sched/tropical.py", "on_iteration_end")


class PathTrace:
    """The calls and returns of the task that entered ``Router._step``, up to the toggle."""

    def __init__(self) -> None:
        self.events: list[tuple[str, CodeType]] = []
        self.task: asyncio.Task | None = None
        self.done = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event in ("call", "return") and not self.done:
            self._see(frame, event)
        return self

    def _see(self, frame: FrameType, event: str) -> None:
        code = frame.f_code
        task = asyncio.current_task()
        if self.task is None:
            if event != "call" or not _is(code, START):
                return
            self.task = task
        if task is not self.task or not code.co_filename.startswith(SRC) or _paused(frame, event):
            return
        self.events.append((event, code))
        self.done = event == "call" and _is(code, TOGGLE)


def _is(code: CodeType, where: tuple[str, str]) -> bool:
    return code.co_filename.endswith(where[0]) and code.co_name == where[1]


def _paused(frame: FrameType, event: str) -> bool:
    """A coroutine suspended at an await (a 'return' at YIELD_VALUE) or resumed after one (a
    'call' at RESUME with a non-zero argument): neither is a step."""
    code, at = frame.f_code, frame.f_lasti
    if not code.co_flags & GENERATOR:
        return False
    if event == "return":
        return code.co_code[at] == dis.opmap["YIELD_VALUE"]
    return code.co_code[at] == dis.opmap["RESUME"] and code.co_code[at + 1] != 0


async def trace_one_iteration(loop: VirtualLoop, trace: PathTrace) -> None:
    policy = make_policy("tropical")
    workers = linear_cluster(2, 50_000).build(policy)
    fake = start_router(loop, policy, workers, {0: 400, 1: 400})
    sys.settrace(trace)
    for rid in range(2):
        fake.router.submit(submission(Request(rid, 0.0, 400, 8, SLO(1.0, 0.1))))
    while not trace.done and loop.time() < 10:
        await asyncio.sleep(0.01)
    sys.settrace(None)
    await fake.router.stop()


def report(trace: PathTrace, verbose: bool) -> str:
    files: set[str] = set()
    functions: set[str] = set()
    stack: list[str] = []
    crossings = crossing_returns = serve = 0
    lines = []
    for event, code in trace.events:
        here = os.path.relpath(code.co_filename, SRC)
        files.add(here)
        if event == "call":
            functions.add(f"{here}:{code.co_qualname}")
            crossings += bool(stack) and stack[-1] != here
            lines.append("  " * len(stack) + f"-> {here}:{code.co_qualname}")
            stack.append(here)
        else:
            stack.pop()
            crossed = bool(stack) and stack[-1] != here
            crossings += crossed
            crossing_returns += crossed
            lines.append("  " * len(stack) + f"<- {here}:{code.co_qualname}")
        serve += here.startswith("serve/")
    calls = sum(event == "call" for event, _ in trace.events)
    summary = (f"{len(trace.events)} steps ({calls} calls, {len(trace.events) - calls} returns) through "
               f"{len(functions)} functions in {len(files)} files; {crossings} steps cross into another "
               f"file ({crossing_returns} of them returns); {serve} steps in serve/")
    return "\n".join([*lines, summary]) if verbose else summary


def main() -> None:
    trace = PathTrace()
    run_virtual(lambda loop: trace_one_iteration(loop, trace))
    if not trace.done:
        raise SystemExit("the traced iteration never reached the toggle")
    print(report(trace, "-v" in sys.argv))


if __name__ == "__main__":
    main()
