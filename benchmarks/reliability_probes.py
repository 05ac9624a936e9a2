"""The hostile-but-fair probes of issue 12 against a live `tropical serve` (tiny-random), each bounded.

Usage: python benchmarks/reliability_probes.py [--json]
Runs the `tropical` next to this Python, with this process's environment, so PYTHONPATH picks the
code under test (e.g. a checkout of an older commit, for a before/after table). Two servers: one
colocated with an API key for the request probes, the 10 MB bodies and SIGTERM; one disagg whose
decoding worker is killed, to compare /health with what requests get. Prints one row per probe:
what came back (an HTTP status, `hang` past its timeout, `dropped` for a closed connection).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tropical.report.tables import render
from tropical.serve.process import ServerProcess

KEY = "probe-key"
AUTH = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
MODEL = "tiny-random"
TEN_MB = json.dumps({"model": MODEL, "prompt": "a " * 5_000_000, "max_tokens": 5}).encode()
BAD_BODIES = {
    "4301+ digit max_tokens": b'{"model": "tiny-random", "max_tokens": ' + b"9" * 5000 + b', "prompt": "hi"}',
    "JSON nested 100k deep": b'{"model": "tiny-random", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "lone surrogate in prompt": b'{"model": "tiny-random", "prompt": "hi \\ud800"}',
    "lone surrogate in message": b'{"model": "tiny-random", "messages": [{"role": "user", '
                                 b'"content": "\\ud800"}]}',
}


def outcome(send: Callable[[], httpx.Response]) -> str:
    """The status a request got, or how it failed to get one."""
    try:
        return str(send().status_code)
    except httpx.TimeoutException:
        return "hang"
    except httpx.TransportError:
        return "dropped"


def post(url: str, body: bytes | dict, path: str = "/v1/completions", timeout: float = 30) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}{path}", content=content, headers=AUTH, timeout=timeout)


def rss_mb(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


def health_stall(url: str, load: Callable[[], object]) -> tuple[float, list[str]]:
    """The longest /health answer (s) while ``load`` runs, and what the loads got."""
    done, worst = threading.Event(), 0.0
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(lambda: (load(), done.set()))
        while not done.wait(0.05):
            start = time.monotonic()
            outcome(lambda: httpx.get(f"{url}/health", timeout=60))
            worst = max(worst, time.monotonic() - start)
        return worst, future.result()[0]


def request_probes(server: ServerProcess) -> list[tuple[str, str]]:
    url, rows = server.url, []
    tiny = {"model": MODEL, "prompt": "hello", "max_tokens": 5, "temperature": 1e-40}
    for name, body in BAD_BODIES.items():
        path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
        rows.append((name, outcome(lambda b=body, p=path: post(url, b, p))))
    rows.append(("unknown path body", httpx.get(f"{url}/v1/nothing", headers=AUTH, timeout=10).text[:60]))
    rows.append(("logprobs: 2", outcome(lambda: post(url, {**tiny, "temperature": 0, "logprobs": 2}))))
    rows += body_probes(server)
    rows.append(("non-streaming client leaves at 0.5 s", left_client(url)))
    rows.append(("/docs with a key set", outcome(lambda: httpx.get(f"{url}/docs", timeout=10))))
    keyless = httpx.get(f"{url}/health", timeout=10).text
    rows.append(("/health without the key shows PIDs", str('"pid"' in keyless)))
    rows.append(("key printed at start-up", str(KEY in server.output())))
    rows.append(("temperature 1e-40 (last: it wedged the old server)", outcome(lambda: post(url, tiny))))
    rows.append(("next normal request", outcome(lambda: post(url, {**tiny, "temperature": 0}))))
    return rows


def body_probes(server: ServerProcess) -> list[tuple[str, str]]:
    url = server.url
    at_start = rss_mb(server.pid)
    start = time.monotonic()
    one = outcome(lambda: post(url, TEN_MB))
    took = time.monotonic() - start
    stall, codes = health_stall(url, lambda: [outcome(lambda: post(url, TEN_MB, timeout=120))
                                              for _ in range(4)])
    rows = [("router RSS before the 10 MB bodies", f"{at_start:.0f} MB"),
            ("10 MB body", f"{one} in {took:.1f} s"),
            ("4 x 10 MB in a row: worst /health", f"{stall:.2f} s ({','.join(codes)})"),
            ("router RSS after them", f"{rss_mb(server.pid):.0f} MB")]
    with ThreadPoolExecutor(4) as pool:
        stall, codes = health_stall(url, lambda: list(pool.map(lambda _: outcome(
            lambda: post(url, TEN_MB, timeout=120)), range(4))))
    rows += [("4 x 10 MB at once: worst /health", f"{stall:.2f} s ({','.join(codes)})"),
             ("router RSS after them", f"{rss_mb(server.pid):.0f} MB")]
    return rows


def aborted(url: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    count = {k: sum(float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith(f'tropical_requests_total{{outcome="{k}"'))
             for k in ("aborted", "finished")}
    return count["aborted"], count["finished"]


def left_client(url: str) -> str:
    before = aborted(url)
    outcome(lambda: post(url, {"model": MODEL, "prompt": "go", "max_tokens": 1000, "ignore_eos": True},
                         timeout=0.5))
    time.sleep(5)
    after = aborted(url)
    if after[0] > before[0]:
        return "aborted"
    return "ran to the end" if after[1] > before[1] else "still running"


def shutdown_probes(server: ServerProcess) -> list[tuple[str, str]]:
    body = {"model": MODEL, "prompt": "go", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    late, tail = "not tried", ["hang"]
    try:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=AUTH,
                          timeout=30) as reply:
            lines = reply.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            os.kill(server.pid, signal.SIGTERM)
            time.sleep(0.3)
            late = outcome(lambda: post(server.url, {"model": MODEL, "prompt": "hi", "max_tokens": 2},
                                        timeout=10))
            tail = [line for line in lines if line][-2:]
    except httpx.HTTPError as exc:
        tail = [type(exc).__name__]
    return [("request during SIGTERM drain", late.replace("dropped", "refused")),
            ("stream past --drain-timeout ends with an error event", str('"error"' in "".join(tail)))]


def kv_wait_probe(url: str) -> str:
    """A holds the decoding worker's KV; B, prefilled, waits to migrate there; A's client leaves.
    How long until B streams again (before the fix, only an unrelated finish woke it)."""
    body = {"model": MODEL, "prompt": "go", "max_tokens": 900, "ignore_eos": True, "stream": True}
    times: list[float] = []

    def read_b() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=AUTH, timeout=30) as reply:
            times.extend(time.monotonic() for line in reply.iter_lines() if line.startswith("data: "))

    with ThreadPoolExecutor(1) as pool:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=AUTH, timeout=30) as a:
            lines = a.iter_lines()  # kept: a dropped iterator would close A's connection at once
            next(line for line in lines if line.startswith("data: "))
            b = pool.submit(read_b)
            deadline = time.monotonic() + 10
            while not times and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
            waiting = len(times)
            left = time.monotonic()
        try:
            b.result(60)
        except httpx.TimeoutException:
            return f"B had {waiting} chunk(s), then hung"
    later = [t - left for t in times if t > left]
    return f"B had {waiting} chunk(s), resumed {later[0]:.2f} s after A left" if later else "B never resumed"


def death_probes(tmp: Path) -> list[tuple[str, str]]:
    server = ServerProcess.start(["--model", MODEL, "--policy", "disagg", "--api-key", KEY, "--kv-tokens",
                                  "1024"], tmp / "disagg.log")
    try:
        rows = [("KV wait, then the holder's client leaves", kv_wait_probe(server.url))]
        workers = httpx.get(f"{server.url}/health", headers=AUTH, timeout=10).json()["workers"]
        os.kill(next(w["pid"] for w in workers if w["role"] == "decode"), signal.SIGKILL)
        time.sleep(2)
        served = outcome(lambda: post(server.url, {"model": MODEL, "prompt": "hi", "max_tokens": 2}))
        health = outcome(lambda: httpx.get(f"{server.url}/health", timeout=10))
        return rows + [("decode worker killed: request / health", f"{served} / {health}")]
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess.start(["--model", MODEL, "--policy", "colocated", "--api-key", KEY,
                                      "--drain-timeout", "1"], Path(tmp) / "colocated.log")
        try:
            rows = request_probes(server) + shutdown_probes(server)
        finally:
            server.stop()
        rows += death_probes(Path(tmp))
    if args.json:
        print(json.dumps(dict(rows), indent=2))
    else:
        print(render(["probe", "result"], [list(r) for r in rows]))


if __name__ == "__main__":
    main()
