"""Load-test the live router over mock workers: how many decisions a second it sustains, its CPU
per request, its decision latency, and what limits it, at 16, 64 and 256 workers.

Usage: python benchmarks/router_load.py [--sizes 16,64,256] [--policies tropical,colocated]
           [--concurrency 64] [--seconds 15] [--warmup 3] [--prompt-tokens 256] [--max-tokens 8]
           [--time-scale 0.05] [--breakdown] [--json]

Each cell starts `tropical serve --engine mock --workers N --policy P` (paper-cluster mock workers
sleeping ``--time-scale`` of their predicted times, so the workers are never what limits) in a
child process whose router is instrumented from outside: every call of the Cluster's ``arrive``
(an arrival), ``plan`` (an iteration's batch) and ``book`` (an iteration's end) is timed with its
time of day, and a task measures the event loop's lag (how late a 10 ms sleep wakes). Then
``--concurrency`` closed-loop clients stream completions of ``--prompt-tokens`` distinct prompt
tokens and ``--max-tokens`` output tokens for ``--warmup`` + ``--seconds`` seconds; only the last
``--seconds`` count. The same load at every size, so a cost that grows with the workers shows as
growth down each policy's rows.

Columns: completed requests/s; decisions/s (arrive + plan + book calls a second) and per second of
router CPU (what one core of its own would sustain, where contention starves it); router CPU per
request (the server process's user+system time over the window, mock workers included, since they
run on the router's loop: an upper bound on the router's own) and the cores it used; the share of
that CPU spent deciding (the decisions' own thread CPU time) and the mean CPU time of each kind of
call; decision P50/P99 in wall time (what a
request waits) and P99 in CPU time (what the call costs, whatever else the machine runs); the loop
lag P99; the load generator's CPU use (cores); and the limit: "event loop" when the router process
uses a whole core (it is one thread), split by whether deciding takes most of it ("policy") or the
rest does (HTTP, streaming, bookkeeping: "HTTP streaming"), "load generator" when the clients'
process uses a whole core, or "CPU contention" when neither does and the machine's load average
exceeds its cores (a shared machine: the CPU columns still hold, the rates and wall times do not).
``--breakdown`` profiles the router process (cProfile, which slows it: run it apart from the
numbers above) and adds a table of where its CPU goes: the policy (sched, core), the mock workers,
HTTP (uvicorn, FastAPI, pydantic, JSON), metrics (prometheus_client), the router and its streams,
and the event loop itself (the profiler's cost per call inflates call-dense code, the policy most:
take the policy's share from the main table, and the split of the rest from this one).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from array import array
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tropical.report.tables import render
from tropical.serve.process import ServerProcess, free_port

INSTRUMENTED = "--instrumented-serve"
PROFILE_ENV = "ROUTER_LOAD_PROFILE"
TIMED_CALLS = ("arrive", "plan", "book")
LAG_PERIOD_S = 0.01
CLOCK_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


class TimedCluster:
    """A Cluster whose decisions are timed into ``samples`` (time of day, wall seconds, CPU
    seconds of this thread: a shared machine stretches the wall, not the CPU time; the call's
    index in TIMED_CALLS); every other attribute is the Cluster's own."""

    def __init__(self, cluster: Any, samples: array) -> None:
        self._cluster = cluster
        self._samples = samples
        for kind, name in enumerate(TIMED_CALLS):
            setattr(self, name, self._timed(getattr(cluster, name), kind))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)

    def _timed(self, call: Any, kind: int) -> Any:
        samples = self._samples

        def timed(*args: Any, **kwargs: Any) -> Any:
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return call(*args, **kwargs)
            finally:
                wall, spent = time.perf_counter() - start, time.thread_time() - cpu
                samples.extend((time.monotonic(), wall, spent, kind))
        return timed


async def watch_loop(lags: array) -> None:
    """How late each short sleep wakes: the event loop's lag (time of day, seconds)."""
    while True:
        start = time.perf_counter()
        await asyncio.sleep(LAG_PERIOD_S)
        lags.extend((time.monotonic(), time.perf_counter() - start - LAG_PERIOD_S, 0.0, -1))


def instrumented_serve(out: Path, serve_args: list[str]) -> int:
    """`tropical serve` with its router's decisions and loop lag recorded, written to ``out`` when
    the router stops (uvicorn ends the process by the signal that stopped it, so no atexit runs)."""
    from tropical.cli import main
    from tropical.serve.router import Router

    decisions, lags = array("d"), array("d")
    init, start, stop = Router.__init__, Router.start, Router.stop
    profiler = cProfile.Profile(time.thread_time) if os.environ.get(PROFILE_ENV) else None  # CPU, not wall

    def timed_init(self: Router, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.cluster = TimedCluster(self.cluster, decisions)  # type: ignore[assignment]

    def start_watching(self: Router) -> None:
        start(self)
        self.lag_watch = asyncio.create_task(watch_loop(lags))  # type: ignore[attr-defined]
        if profiler is not None:
            profiler.enable()

    async def stop_and_write(self: Router) -> None:
        parts = {}
        if profiler is not None:
            profiler.disable()
            parts = cpu_by_part(pstats.Stats(profiler))
        await stop(self)
        out.write_text(json.dumps({"decisions": list(decisions), "lags": list(lags), "parts": parts}))

    Router.__init__ = timed_init  # type: ignore[method-assign]
    Router.start = start_watching  # type: ignore[method-assign]
    Router.stop = stop_and_write  # type: ignore[method-assign]
    return main(["serve", *serve_args])


PARTS = (("policy", ("tropical/sched/", "tropical/core/")), ("mock workers", ("tropical/serve/mock/",)),
         ("HTTP", ("tropical/serve/http/", "/uvicorn/", "/h11/", "/starlette/", "/fastapi/", "/pydantic",
                   "/anyio/", "/json/")),
         ("metrics", ("/prometheus_client/",)), ("router and streams", ("tropical/",)),
         ("event loop", ("/asyncio/", "selectors.py")), ("instrumentation", ("benchmarks/router_load.py",)))
"""Where the router process's CPU goes, by the file each function is in (first match)."""


def cpu_by_part(stats: pstats.Stats) -> dict[str, float]:
    """Seconds of the profiled thread's own time in each of PARTS (and "other"); a C built-in's
    time (a socket send, a dict lookup) goes to the parts of the functions that called it."""
    parts: dict[str, float] = {}
    for (filename, _, _), (_, _, own, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        spent = ({caller[0]: times[2] for caller, times in callers.items()} if filename == "~" and callers
                 else {filename: own})
        for where, seconds in spent.items():
            part = next((name for name, marks in PARTS if any(m in where for m in marks)), "other")
            parts[part] = parts.get(part, 0.0) + seconds
    return parts


@dataclass(frozen=True)
class Cell:
    policy: str
    workers: int
    requests_per_s: float
    decisions_per_s: float
    router_cpu_ms_per_request: float
    router_cores: float
    deciding_share: float
    decision_p50_us: float
    decision_p99_us: float
    decision_cpu_p99_us: float
    loop_lag_p99_ms: float
    client_cores: float
    load_average: float
    errors: int
    cpu_us_by_call: dict[str, float]
    parts: dict[str, float]

    @property
    def limit(self) -> str:
        if self.router_cores >= 0.9:
            return "event loop: policy" if self.deciding_share >= 0.5 else "event loop: HTTP streaming"
        if self.client_cores >= 0.9:
            return "load generator"
        if self.load_average > os.cpu_count():
            return f"CPU contention: load {self.load_average:.1f} on {os.cpu_count()} cores"
        return "none saturated (raise --concurrency)"


class Load:
    """Closed-loop streaming clients; counts what completes inside the measured window."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url, self.args = url, args
        self.window: tuple[float, float] = (0.0, 0.0)
        self.completed = 0
        self.errors = 0
        self._next = 0

    def prompt(self) -> list[int]:
        """Distinct prompts (a different first token), so the prefix caches hit little."""
        self._next += 1
        return [5 + (self._next * 7919 + j * 104729) % 500 for j in range(self.args.prompt_tokens)]

    async def client(self, http: httpx.AsyncClient, model: str, end: float) -> None:
        body = {"model": model, "max_tokens": self.args.max_tokens, "stream": True}
        while time.monotonic() < end:
            try:
                request = {**body, "prompt": self.prompt()}
                async with http.stream("POST", f"{self.url}/v1/completions", json=request) as reply:
                    reply.raise_for_status()
                    async for line in reply.aiter_lines():
                        if line == "data: [DONE]":
                            break
                self.completed += self.window[0] <= time.monotonic() <= self.window[1]
            except httpx.HTTPError:
                self.errors += 1

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=self.args.concurrency)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            model = (await http.get(f"{self.url}/v1/models")).json()["data"][0]["id"]
            begin = time.monotonic() + self.args.warmup
            self.window = (begin, begin + self.args.seconds)
            await asyncio.gather(*(self.client(http, model, self.window[1])
                                   for _ in range(self.args.concurrency)))


def cpu_seconds(pid: int) -> float:
    """User plus system time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * CLOCK_TICK_S


def run_cell(policy: str, workers: int, args: argparse.Namespace, out: Path) -> Cell:
    samples = out / f"samples-{policy}-{workers}.json"
    log = out / f"serve-{policy}-{workers}.log"
    port = free_port()
    serve = ["--engine", "mock", "--workers", str(workers), "--policy", policy, "--mock-time-scale",
             str(args.time_scale), "--max-waiting", "100000", "--port", str(port)]
    with log.open("w") as sink:
        env = {**os.environ, PROFILE_ENV: "1"} if args.breakdown else None
        process = subprocess.Popen([sys.executable, __file__, INSTRUMENTED, str(samples), *serve],
                                   stdout=sink, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(f"http://127.0.0.1:{port}", process, log)
    try:
        server.wait_healthy(180)
        load = Load(server.url, args)
        measured = asyncio.run(measure(load, server.pid))
    finally:
        server.stop()
    data = json.loads(samples.read_text())
    return summarize(policy, workers, load, measured, data)


async def measure(load: Load, pid: int) -> dict[str, float]:
    """Run the load; the router's and the clients' CPU time over the measured window."""
    task = asyncio.create_task(load.run())
    while not load.window[0]:
        await asyncio.sleep(0.01)
    await asyncio.sleep(max(0.0, load.window[0] - time.monotonic()))
    router0, client0 = cpu_seconds(pid), own_cpu()
    await asyncio.sleep(max(0.0, load.window[1] - time.monotonic()))
    router1, client1 = cpu_seconds(pid), own_cpu()
    await task
    return {"router_cpu": router1 - router0, "client_cpu": client1 - client0,
            "load_average": os.getloadavg()[0]}


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def in_window(samples: list[float], window: tuple[float, float]) -> np.ndarray:
    """(wall, CPU, kind) of the (time of day, wall, CPU, kind) samples inside ``window``."""
    rows = np.asarray(samples).reshape(-1, 4)
    return rows[(rows[:, 0] >= window[0]) & (rows[:, 0] <= window[1]), 1:]


def summarize(policy: str, workers: int, load: Load, measured: dict[str, float], data: dict) -> Cell:
    seconds = load.window[1] - load.window[0]
    decisions = in_window(data["decisions"], load.window)
    wall, cpu, kinds = decisions[:, 0], decisions[:, 1], decisions[:, 2]
    by_call = {name: float(cpu[kinds == kind].mean()) * 1e6 if (kinds == kind).any() else float("nan")
               for kind, name in enumerate(TIMED_CALLS)}
    lags = in_window(data["lags"], load.window)[:, 0]
    router_cpu = measured["router_cpu"]
    return Cell(policy, workers, load.completed / seconds, len(decisions) / seconds,
                router_cpu / max(load.completed, 1) * 1e3, router_cpu / seconds,
                float(cpu.sum()) / max(router_cpu, 1e-9), percentile_us(wall, 50), percentile_us(wall, 99),
                percentile_us(cpu, 99), percentile_us(lags, 99) / 1e3, measured["client_cpu"] / seconds,
                measured["load_average"], load.errors, by_call, data["parts"])


def percentile_us(seconds: np.ndarray, q: float) -> float:
    return float(np.percentile(seconds, q)) * 1e6 if len(seconds) else float("nan")


def table(cells: list[Cell]) -> str:
    rows = [[c.policy, str(c.workers), f"{c.requests_per_s:,.0f}", f"{c.decisions_per_s:,.0f}",
             f"{c.decisions_per_s / max(c.router_cores, 1e-9):,.0f}", f"{c.router_cpu_ms_per_request:.2f}",
             f"{c.router_cores:.2f}", f"{c.deciding_share:.0%}",
             "/".join(f"{c.cpu_us_by_call[name]:.0f}" for name in TIMED_CALLS),
             f"{c.decision_p50_us:.0f}", f"{c.decision_p99_us:.0f}", f"{c.decision_cpu_p99_us:.0f}",
             f"{c.loop_lag_p99_ms:.1f}", f"{c.client_cores:.2f}", str(c.errors), c.limit] for c in cells]
    return render(["policy", "workers", "req/s", "decisions/s", "decisions/core-s", "router CPU ms/req",
                   "router cores", "deciding", "CPU us arrive/plan/book",
                   "decision P50 us", "decision P99 us", "decision CPU P99 us",
                   "loop lag P99 ms", "client cores", "errors", "limit"], rows)


def breakdown(cells: list[Cell]) -> str:
    """Each part's share of the router's profiled CPU time."""
    names = [name for name, _ in PARTS] + ["other"]
    rows = [[c.policy, str(c.workers), *(f"{c.parts.get(n, 0.0) / sum(c.parts.values()):.0%}" for n in names)]
            for c in cells]
    return render(["policy", "workers", *names], rows)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == INSTRUMENTED:
        sys.exit(instrumented_serve(Path(sys.argv[2]), sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,64,256")
    parser.add_argument("--policies", default="tropical,colocated")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--breakdown", action="store_true",
                        help="profile the router (cProfile: slower) and show where its CPU goes")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="router-load-"))
    cells = []
    for policy in args.policies.split(","):
        for workers in (int(s) for s in args.sizes.split(",")):
            cells.append(run_cell(policy, workers, args, out))
            print(f"{policy} at {workers} workers: {cells[-1].requests_per_s:.0f} req/s", file=sys.stderr)
    if args.json:
        print(json.dumps([asdict(c) | {"limit": c.limit} for c in cells]))
        return
    print(table(cells))
    if args.breakdown:
        print(breakdown(cells))


if __name__ == "__main__":
    main()
