"""The chaos soak: a live `tropical serve` (Ray backend, so a killed worker is revived) replays a trace
at 80% of its measured capacity for ``--minutes``, with one worker SIGKILLed every ``--kill-every``
seconds and a ``--burst-factor``x burst of ``--burst-seconds`` every ``--burst-every`` seconds.

Usage: python benchmarks/soak.py [--model smollm2] [--minutes 30] [--rate R] [--out DIR] [--json]

Without ``--rate`` a short ramp measures the capacity first: steps of ``--ramp-requests`` requests at
rising rates until fewer than 90% meet their SLO; the capacity is the last step that held.

Every request sent ends in exactly one outcome:
  ok        streamed to [DONE] (within its SLO or not: goodput counts those within)
  rejected  429 (admission, or a full queue)
  failed    an error the server sent in the stream or as a 4xx (a request whose worker was killed)
  5xx       an HTTP 5xx status
  hung      no end within ``--deadline`` seconds
  lost      the connection ended without an answer (no status, or a stream cut without [DONE])
Lost and hung must be 0. RSS (``/proc/<pid>/status`` VmRSS) of the router and of each worker (PIDs
from /health) is sampled every ``--sample-every`` seconds; it is flat when the mean over the last
third of the run is within 10% of the mean over the first third after warm-up (the first sixth).
Writes soak.json, soak.md and soak.png under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from tropical.bench.plan import PlannedRequest, fit_context
from tropical.bench.record import Measurement
from tropical.bench.replay import completion_body
from tropical.bench.stream import measure
from tropical.core.metrics import attains
from tropical.core.slo import SLO
from tropical.serve.process import ServerProcess
from tropical.workload.catalog import load_slice
from tropical.workload.transform import LengthBounds

HTTP_STATUS = re.compile(r"^HTTP (\d{3})")
FLAT = 0.10
HOLDS = 0.9


@dataclass(frozen=True)
class Chaos:
    """When the soak kills a worker and when it bursts, in seconds from the start."""

    seconds: float
    kill_every: float
    burst_every: float
    burst_seconds: float
    burst_factor: float

    def kills(self) -> list[float]:
        return _every(self.kill_every, self.seconds)

    def bursts(self) -> list[float]:
        return [t for t in _every(self.burst_every, self.seconds) if t + self.burst_seconds <= self.seconds]

    def trace_seconds(self) -> float:
        """Trace time the run covers: a burst plays the trace ``burst_factor`` times as fast."""
        return self.seconds + (self.burst_factor - 1) * self.burst_seconds * len(self.bursts())

    def wall(self, trace_t: float) -> float:
        """When a request at ``trace_t`` in the trace is sent (the inverse of the burst time warp)."""
        wall, played = 0.0, 0.0
        for start in self.bursts():
            if trace_t <= played + (start - wall):
                break
            played += start - wall
            burst_trace = self.burst_seconds * self.burst_factor
            if trace_t <= played + burst_trace:
                return start + (trace_t - played) / self.burst_factor
            played += burst_trace
            wall = start + self.burst_seconds
        return wall + (trace_t - played)


@dataclass
class Sample:
    """RSS in MiB at one moment: the router's, and each live worker's by id."""

    t: float
    router_mib: float
    workers_mib: dict[int, float]


@dataclass
class Log:
    """What happened during a run besides the requests: kills, revivals, RSS samples."""

    kills: list[dict] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)


def _every(period: float, until: float) -> list[float]:
    if period <= 0:
        return []
    count = int(until // period)
    return [period * k for k in range(1, count + 1) if period * k < until]


def outcome(m: Measurement) -> str:
    """One of ok, rejected, failed, 5xx, hung, lost (see the module's docstring)."""
    if m.error is None:
        return "ok"
    if m.error.startswith("timed out"):
        return "hung"
    status = HTTP_STATUS.match(m.error)
    if status:
        code = int(status.group(1))
        return "rejected" if code == 429 else "5xx" if code >= 500 else "failed"
    if m.error.startswith("server error:"):
        return "failed"
    return "lost"


def rss_mib(pid: int | None) -> float | None:
    """VmRSS of ``pid`` in MiB; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (OSError, TypeError):
        return None
    kb = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(kb.group(1)) / 1024 if kb else None


def plan(trace: str, rate: float, chaos: Chaos, bounds: LengthBounds, seed: int,
         max_model_len: int | None) -> list[PlannedRequest]:
    """The trace's requests at ``rate`` (Poisson), sent at their burst-warped wall times."""
    entries = load_slice(trace, None, seed=seed, rate=rate, bounds=bounds,
                         end_s=chaos.trace_seconds()).entries
    planned = []
    for i, e in enumerate(entries):
        prompt, output = fit_context(e.input_len, e.output_len, max_model_len)
        planned.append(PlannedRequest(i, chaos.wall(e.arrival), prompt, output, e.prefix_blocks))
    return planned


async def _health(client: httpx.AsyncClient) -> list[dict]:
    try:
        return (await client.get("/health", timeout=5)).json().get("workers", [])
    except (httpx.HTTPError, ValueError):
        return []


async def _kill(client: httpx.AsyncClient, at: float, victim: int, log: Log, clock) -> None:
    """SIGKILL worker ``victim`` at ``at`` seconds, then note when /health shows it back."""
    await asyncio.sleep(max(0.0, at - clock()))
    worker = next((w for w in await _health(client) if w["id"] == victim and w.get("pid")), None)
    if worker is None:
        log.kills.append({"at_s": round(clock(), 1), "worker": victim, "pid": None, "revived_s": None})
        return
    os.kill(worker["pid"], signal.SIGKILL)
    kill = {"at_s": round(clock(), 1), "worker": victim, "pid": worker["pid"], "revived_s": None}
    log.kills.append(kill)
    while clock() < at + 600:
        await asyncio.sleep(1.0)
        back = next((w for w in await _health(client) if w["id"] == victim), None)
        if back and back.get("alive") and back.get("pid") not in (None, worker["pid"]):
            kill["revived_s"] = round(clock() - kill["at_s"], 1)
            return


async def _sample(client: httpx.AsyncClient, router_pid: int, every: float, log: Log, clock,
                  done: asyncio.Event) -> None:
    while not done.is_set():
        workers = {w["id"]: rss_mib(w.get("pid")) for w in await _health(client) if w.get("alive")}
        log.samples.append(Sample(round(clock(), 1), rss_mib(router_pid) or 0.0,
                                  {i: v for i, v in workers.items() if v is not None}))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done.wait(), every)


async def replay(url: str, planned: list[PlannedRequest], model: str, slo: SLO, deadline: float,
                 chaos: Chaos | None, router_pid: int, sample_every: float) -> tuple[list[Measurement], Log]:
    """Send every planned request on time; kill and sample as ``chaos`` says (None: neither)."""
    headers = {"x-slo-ttft-ms": f"{slo.ttft * 1e3:g}", "x-slo-tpot-ms": f"{slo.tpot * 1e3:g}"}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    log, done = Log(), asyncio.Event()
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(deadline)) as client:
        start = time.perf_counter()

        def clock() -> float:
            return time.perf_counter() - start

        side = []
        if chaos is not None:
            ids = sorted(w["id"] for w in await _health(client))
            side = [asyncio.create_task(_kill(client, t, ids[k % len(ids)], log, clock))
                    for k, t in enumerate(chaos.kills())]
            side.append(asyncio.create_task(_sample(client, router_pid, sample_every, log, clock, done)))
        tasks = []
        for req in planned:
            await asyncio.sleep(max(0.0, req.send_at - clock()))
            m = Measurement(req.id, req.prompt_len, req.output_len)
            tasks.append(asyncio.create_task(measure(client, completion_body(req, model, "ids", 0), m,
                                                     clock, deadline)))
        measured = list(await asyncio.gather(*tasks))
        done.set()
        await asyncio.gather(*side)
    return measured, log


def attained(measured: list[Measurement], slo: SLO) -> list[Measurement]:
    return [m for m in measured if m.error is None and attains(m.to_request(slo))]


def ramp(args: argparse.Namespace, server: ServerProcess, model: str, slo: SLO) -> tuple[float, list[dict]]:
    """The highest rate of the ramp at which >= 90% of requests met their SLO, and every step."""
    steps, rate, held = [], args.ramp_start, None
    for _ in range(args.ramp_steps):
        chaos = Chaos(args.ramp_requests / rate, 0, 0, 0, 1)
        planned = plan(args.trace, rate, chaos, _bounds(args), args.seed, None)
        measured, _ = asyncio.run(replay(server.url, planned, model, slo, args.deadline, None, server.pid, 0))
        share = len(attained(measured, slo)) / max(1, len(measured))
        steps.append({"rate_rps": round(rate, 4), "requests": len(measured), "attained": round(share, 3)})
        print(f"ramp: {rate:.3f} req/s, {share:.0%} within SLO", file=sys.stderr)
        if share < HOLDS:
            break
        held, rate = rate, rate * args.ramp_factor
    if held is None:
        raise SystemExit(f"the ramp's first rate ({args.ramp_start} req/s) already misses its SLO; "
                         f"lower --ramp-start")
    return held, steps


def _bounds(args: argparse.Namespace) -> LengthBounds:
    return LengthBounds(None, args.max_input, None, args.max_output)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def rss_trend(samples: list[Sample], seconds: float) -> dict:
    """Mean RSS over the first and the last third after warm-up (the first sixth), router and workers."""
    warm, third = seconds / 6, seconds / 3
    first = [s for s in samples if warm <= s.t < warm + third]
    last = [s for s in samples if s.t >= seconds - third]
    out = {}
    picks = (("router", lambda s: [s.router_mib]), ("workers", lambda s: list(s.workers_mib.values())))
    for name, pick in picks:
        a = _mean([v for s in first for v in pick(s)])
        b = _mean([v for s in last for v in pick(s)])
        ratio = b / a if a else None
        out[name] = {"first_mib": round(a, 1), "last_mib": round(b, 1),
                     "ratio": None if ratio is None else round(ratio, 3),
                     "flat": ratio is not None and abs(ratio - 1) <= FLAT}
    return out


def report(args: argparse.Namespace, rate: float, capacity: float | None, steps: list[dict], chaos: Chaos,
           measured: list[Measurement], log: Log, slo: SLO) -> dict:
    outcomes = Counter(outcome(m) for m in measured)
    good = {m.id for m in attained(measured, slo)}
    minutes = int(-(-chaos.seconds // 60))
    per_minute = [sum(1 for m in measured if m.id in good and i * 60 <= m.sent < (i + 1) * 60) / 60
                  for i in range(minutes)]
    errors = Counter(m.error[:120] for m in measured if outcome(m) != "ok")
    return {
        "model": args.model, "policy": args.policy, "admission": args.admission, "trace": args.trace,
        "minutes": args.minutes, "capacity_rps": capacity, "ramp": steps, "rate_rps": round(rate, 4),
        "slo_ms": {"ttft": slo.ttft * 1e3, "tpot": slo.tpot * 1e3}, "chaos": asdict(chaos),
        "sent": len(measured), "outcomes": {k: outcomes.get(k, 0) for k in
                                            ("ok", "rejected", "failed", "5xx", "hung", "lost")},
        "attained": len(good), "goodput_rps": round(len(good) / chaos.seconds, 4),
        "goodput_per_minute_rps": [round(g, 4) for g in per_minute],
        "kills": log.kills, "errors": dict(errors.most_common(10)),
        "rss_mib": rss_trend(log.samples, chaos.seconds), "rss_samples": [asdict(s) for s in log.samples],
    }


def markdown(r: dict) -> str:
    o, rss = r["outcomes"], r["rss_mib"]
    cap = f"{r['capacity_rps']:.3f} req/s (ramp)" if r["capacity_rps"] else "given (--rate)"
    lines = [
        f"# Soak: {r['model']}, {r['policy']}, admission {r['admission']}, {r['minutes']} min",
        "",
        f"- Capacity {cap}; offered {r['rate_rps']:.3f} req/s, bursts {r['chaos']['burst_factor']:g}x for "
        f"{r['chaos']['burst_seconds']:g} s every {r['chaos']['burst_every']:g} s, a worker killed every "
        f"{r['chaos']['kill_every']:g} s.",
        f"- Sent {r['sent']}: ok {o['ok']}, rejected (429) {o['rejected']}, failed {o['failed']}, "
        f"5xx {o['5xx']}, hung {o['hung']}, lost {o['lost']}.",
        f"- Goodput {r['goodput_rps']:.3f} req/s ({r['attained']} within SLO "
        f"{r['slo_ms']['ttft']:g} ms TTFT, {r['slo_ms']['tpot']:g} ms TPOT).",
        "- Kills: " + ", ".join(f"worker {k['worker']} at {k['at_s']} s (back after {k['revived_s']} s)"
                                for k in r["kills"]) if r["kills"] else "- Kills: none",
        "",
        "| RSS (MiB) | first third after warm-up | last third | ratio | flat (within 10%) |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {name} | {v['first_mib']} | {v['last_mib']} | {v['ratio']} | {v['flat']} |"
              for name, v in rss.items()]
    lines += ["", "Goodput per minute (req/s): " + ", ".join(f"{g:.3f}" for g in r["goodput_per_minute_rps"])]
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    minutes = range(len(r["goodput_per_minute_rps"]))
    top.bar([m * 60 + 30 for m in minutes], r["goodput_per_minute_rps"], width=50, label="goodput")
    top.axhline(r["rate_rps"], color="grey", linestyle="--", label="offered")
    top.set_ylabel("req/s within SLO")
    samples = r["rss_samples"]
    bottom.plot([s["t"] for s in samples], [s["router_mib"] for s in samples], label="router")
    for wid in sorted({int(w) for s in samples for w in s["workers_mib"]}):
        pts = [(s["t"], s["workers_mib"][w]) for s in samples for w in s["workers_mib"] if int(w) == wid]
        bottom.plot([p[0] for p in pts], [p[1] for p in pts], label=f"worker {wid}")
    bottom.set_ylabel("RSS (MiB)")
    bottom.set_xlabel("seconds")
    for ax in (top, bottom):
        for k in r["kills"]:
            ax.axvline(k["at_s"], color="red", alpha=0.4)
        for b in Chaos(**r["chaos"]).bursts():
            ax.axvspan(b, b + r["chaos"]["burst_seconds"], color="orange", alpha=0.2)
        ax.legend(loc="upper right", fontsize=8)
    fig.suptitle("Soak: kills (red), bursts (orange)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--policy", default="tropical+")
    p.add_argument("--workers", default="prefill,multiplex,multiplex",
                   help="worker roles (two that decode, so one killed never leaves none)")
    p.add_argument("--admission", default="early-reject")
    p.add_argument("--trace", default="conversation")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=float, help="offered req/s (default: 80%% of the ramp's capacity)")
    p.add_argument("--load", type=float, default=0.8, help="share of the measured capacity to offer")
    p.add_argument("--kill-every", type=float, default=300.0)
    p.add_argument("--burst-every", type=float, default=600.0)
    p.add_argument("--burst-seconds", type=float, default=10.0)
    p.add_argument("--burst-factor", type=float, default=3.0)
    p.add_argument("--max-input", type=int, default=512)
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--slo-ttft-ms", type=float, default=10000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=500.0)
    p.add_argument("--deadline", type=float, default=300.0, help="seconds after which a request is hung")
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--ramp-start", type=float, default=0.1)
    p.add_argument("--ramp-factor", type=float, default=1.5)
    p.add_argument("--ramp-steps", type=int, default=6)
    p.add_argument("--ramp-requests", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--serve-arg", action="append", default=[], help="extra `tropical serve` argument")
    p.add_argument("--out", default=None, help="directory for soak.json, soak.md, soak.png")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line")
    args = p.parse_args()
    slo = SLO(args.slo_ttft_ms / 1e3, args.slo_tpot_ms / 1e3)
    out = Path(args.out or tempfile.mkdtemp(prefix="soak-"))
    out.mkdir(parents=True, exist_ok=True)
    serve = ["--model", args.model, "--backend", "ray", "--policy", args.policy, "--workers", args.workers,
             "--admission", args.admission, *args.serve_arg]
    server = ServerProcess.start(serve, out / "serve.log", timeout=900)
    try:
        model = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
        capacity, steps = (None, []) if args.rate else ramp(args, server, model, slo)
        rate = args.rate or args.load * capacity
        chaos = Chaos(args.minutes * 60, args.kill_every, args.burst_every, args.burst_seconds,
                      args.burst_factor)
        planned = plan(args.trace, rate, chaos, _bounds(args), args.seed + 1, None)
        measured, log = asyncio.run(replay(server.url, planned, model, slo, args.deadline, chaos, server.pid,
                                           args.sample_every))
    finally:
        server.stop(timeout=60)
    r = report(args, rate, capacity, steps, chaos, measured, log, slo)
    (out / "soak.json").write_text(json.dumps(r, indent=1))
    (out / "soak.md").write_text(markdown(r))
    plot(r, out / "soak.png")
    print(json.dumps(r) if args.json else markdown(r) + f"\nwritten to {out}")


if __name__ == "__main__":
    main()
