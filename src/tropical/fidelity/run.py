"""Run the fidelity study: for each policy, a live `tropical serve`, the trace slice replayed by
`tropical bench`, and the simulator's twin of that run on the engine's measured profile."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tropical.bench.config import BenchConfig
from tropical.bench.plan import PlannedRequest
from tropical.bench.record import Measurement
from tropical.bench.run import BenchRun, run_bench
from tropical.bench.summary import hit_rate
from tropical.calibration.store import load_profile
from tropical.core.gaps import GapHistogram
from tropical.core.latency.adjusted import AdjustedModel
from tropical.core.latency.model import LatencyModel
from tropical.core.metrics import goodput, summarize
from tropical.core.slo import SLO
from tropical.fidelity.compare import DRIFT, Comparison
from tropical.fidelity.overheads import (
    adjusted,
    frontend_latency,
    measured_speed,
    profile_ratio,
    scrape,
    transfer_scale,
)
from tropical.fidelity.paths import compare_paths
from tropical.fidelity.repeats import PolicyRepeats
from tropical.fidelity.twin import ServerShape, simulate_twin
from tropical.serve.iteration_log import read_iterations
from tropical.serve.options import policy_and_roles
from tropical.serve.process import ServerProcess


@dataclass(frozen=True)
class FidelityConfig:
    """One study: the model and its profile, the server's shape, the workload, the policies.
    The defaults are the published accuracy study (docs/fidelity.md: short prompts, so queues stay
    short on a host as fast as the profile's), so `tropical fidelity --profile P --repeats 3` reruns it; the
    toggle's win is a second setting (benchmarks/live_win.sh). The servers keep their prefix cache
    (their default), and the twins model it; prompts cut to ``max_input`` keep the trace's shared
    prefix blocks, where ``length_scale`` drops them (scaled prompts no longer match them)."""

    profile: str
    shape: ServerShape = ServerShape(kv_tokens=16384, block_size=16, max_model_len=2048,
                                     max_batched_tokens=2048, prefix_cache=True)
    model: str = "smollm2"
    threads: int = 1
    policies: tuple[str, ...] = ("colocated", "chunked", "disagg", "tropical", "tropical+")
    trace: str = "conversation"
    limit: int = 150
    rate_scale: float = 0.3
    length_scale: float = 0.01
    slo_ttft_ms: float = 3000.0
    slo_tpot_ms: float = 300.0
    seed: int = 0
    repeats: int = 1
    max_input: int | None = None
    max_output: int | None = None

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")

    def bench(self, url: str) -> BenchConfig:
        return BenchConfig(url, self.trace, self.rate_scale, self.length_scale, self.limit, seed=self.seed,
                           slo_ttft_ms=self.slo_ttft_ms, slo_tpot_ms=self.slo_tpot_ms, timeout=300.0,
                           max_input=self.max_input, max_output=self.max_output)

    def serve_args(self, policy: str, iteration_log: Path) -> list[str]:
        """The server gets the study's SLOs too: the toggle decides by them, as its twin does; it
        logs every iteration, which prices the twin."""
        return ["--model", self.model, "--profile", self.profile, "--threads", str(self.threads),
                "--slo-ttft-ms", str(self.slo_ttft_ms), "--slo-tpot-ms", str(self.slo_tpot_ms),
                "--iteration-log", str(iteration_log), *self.shape.serve_args(policy)]


def run_policy(cfg: FidelityConfig, policy: str, log: Path) -> tuple[Comparison, BenchRun]:
    """The real run and its simulated twin for one policy; the server logs to ``log`` and its
    iterations to ``log`` with the suffix ``.iterations.jsonl``."""
    iterations = log.with_suffix(".iterations.jsonl")
    server = ServerProcess.start(cfg.serve_args(policy, iterations), log)
    try:
        real = run_bench(cfg.bench(server.url))
        totals = scrape(server.url)
    finally:
        server.stop()
    profile = load_profile(cfg.profile)
    records = read_iterations(iterations)
    workers = len(policy_and_roles(cfg.shape.options(policy))[1])
    speeds = (measured_speed(profile, records, workers, transfer_scale(profile, totals)) if records
              else [adjusted(profile, totals)] * workers)
    frontend = frontend_latency(totals, real.summary.core.ttft.mean)
    recorded = RecordedRun(real.planned, real.measurements, real.config.slo, cfg.seed)
    ratio = profile_ratio(profile, records)
    return price_run(recorded, policy, cfg.shape, profile, speeds, frontend, ratio), real


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """What a live run leaves to compare its twin with: the requests planned and what the client
    measured of each, under the run's SLOs; ``seed`` made the prompts' token ids."""

    planned: Sequence[PlannedRequest]
    measured: Sequence[Measurement]
    slo: SLO
    seed: int = 0


def price_run(run: RecordedRun, policy: str, shape: ServerShape, profile: LatencyModel,
              speeds: Sequence[AdjustedModel], frontend: float, ratio: float = math.nan) -> Comparison:
    """The run against its twins: on the bare ``profile``, and at the run's measured ``speeds``
    (one per worker) and ``frontend`` latency; both decide with ``profile``, as the server did.
    ``ratio``: the run's compute over the profile's prediction (``profile_ratio``).
    The measured twin runs again at each ``DRIFT`` of its speeds, for the P90 TTFT that a
    repeat's speed alone would move. The server's prefix hit rate (its ``cached_tokens``) is set
    beside the twin's."""
    real = [m.to_request(run.slo) for m in run.measured]
    gaps = GapHistogram()
    for m in run.measured:
        for gap in m.itls() if m.error is None else ():
            gaps.add(gap)
    bare = simulate_twin(run.planned, run.slo, policy, shape, profile, seed=run.seed)
    modeled = simulate_twin(run.planned, run.slo, policy, shape, speeds, frontend, profile, run.seed)
    drift = tuple(simulate_twin(run.planned, run.slo, policy, shape, [AdjustedModel(s, f) for s in speeds],
                                frontend, profile, run.seed).summary().ttft.p90 for f in DRIFT)
    reported = [m for m in run.measured if m.error is None and m.cached_tokens is not None]
    return Comparison(policy, summarize(real, gaps), bare.summary(), modeled.summary(), tuple(speeds),
                      frontend, goodput(real), goodput(modeled.requests),
                      compare_paths(run.measured, modeled.requests), drift, ratio, hit_rate(reported))


def run_study(cfg: FidelityConfig, logs: Path, progress: Callable[[str], None] = lambda _: None,
              keep: Callable[[str, int, Comparison, BenchRun], None] = lambda *_: None,
              ) -> list[tuple[PolicyRepeats, list[BenchRun]]]:
    """Every policy ``cfg.repeats`` times, one round of all policies after another, so a slow
    spell on the shared machine lands on every policy rather than on one policy's repeats.
    ``keep`` gets each run (policy, repeat from 1, comparison, bench run) as soon as it ends, so a
    study cut short still leaves its finished runs."""
    logs.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[tuple[Comparison, BenchRun]]] = {p: [] for p in cfg.policies}
    for k in range(1, cfg.repeats + 1):
        for policy in cfg.policies:
            progress(f"{policy} (repeat {k}/{cfg.repeats}): replaying {cfg.limit} requests ...")
            comparison, run = run_policy(cfg, policy, logs / f"serve-{policy}-{k}.log")
            keep(policy, k, comparison, run)
            runs[policy].append((comparison, run))
    return [(PolicyRepeats(p, tuple(c for c, _ in pairs)), [r for _, r in pairs])
            for p, pairs in runs.items()]
