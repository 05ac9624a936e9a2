"""The simulator's twin of a `tropical serve` run: same workers, roles, KV size, policy, profile
and the very requests the client planned, so any difference is the simulator's error. With the
server's prefix cache on, each twin request names its prompt's blocks by the same chained hashes
of the same token ids the client sent (``bench.prompts``), so the twin's prefix caches hit where
the server's could."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tropical.bench.plan import PlannedRequest
from tropical.bench.prompts import token_ids
from tropical.core.gaps import GapHistogram
from tropical.core.latency.model import LatencyModel
from tropical.core.metrics import Summary, summarize
from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.engine.block_hash import block_hashes
from tropical.sched.fleet import worker_states
from tropical.sched.kv import KVPool
from tropical.serve.options import ServeOptions, policy_and_roles
from tropical.sim.simulator import Simulator


@dataclass(frozen=True, slots=True)
class ServerShape:
    """What the simulator must copy from the server's command line. ``prefix_cache`` is off
    unless asked, so that twins of runs recorded before the server had one stay as they were."""

    kv_tokens: int
    block_size: int
    max_model_len: int
    max_batched_tokens: int
    workers: str | None = None
    prefix_cache: bool = False

    def options(self, policy: str) -> ServeOptions:
        return ServeOptions(policy=policy, workers=self.workers, kv_tokens=self.kv_tokens,
                            block_size=self.block_size, max_model_len=self.max_model_len,
                            max_batched_tokens=self.max_batched_tokens, prefix_cache=self.prefix_cache)

    def serve_args(self, policy: str) -> list[str]:
        args = {"--policy": policy, "--kv-tokens": self.kv_tokens, "--block-size": self.block_size,
                "--max-model-len": self.max_model_len, "--max-batched-tokens": self.max_batched_tokens,
                "--workers": self.workers, "--prefix-cache": "on" if self.prefix_cache else "off"}
        return [str(x) for flag, value in args.items() if value is not None for x in (flag, value)]


@dataclass(frozen=True, slots=True)
class TwinRun:
    """The twin's requests, in arrival order, and every gap between two tokens it booked."""

    requests: list[Request]
    gaps: GapHistogram

    def summary(self) -> Summary:
        return summarize(self.requests, self.gaps)


def simulate_twin(planned: Sequence[PlannedRequest], slo: SLO, policy: str, shape: ServerShape,
                  latency: LatencyModel | Sequence[LatencyModel], frontend: float = 0.0,
                  predictor: LatencyModel | None = None, seed: int = 0,
                  warm: Sequence[Sequence[PlannedRequest]] = ()) -> TwinRun:
    """Simulate ``planned`` on the server's cluster, iterations timed by ``latency`` (one model for
    every worker, or one per worker). Each request reaches the cluster ``frontend`` seconds after
    it is sent (HTTP, parsing, streaming back), and is timed from its send. The policy predicts
    with ``predictor`` (default: the first worker's ``latency``): the server's policy predicts
    with the bare profile it was started with, whatever the machine's real speed, so a twin
    deciding with the measured speed would choose other paths (and corrects it online as the
    server does, where the policy learns from its iterations). ``seed`` is the client's prompt
    seed, which its token ids, and so the prefix blocks' names, come from. ``warm`` lists, per
    worker, the prompts it computed before this run, oldest first: a server whose processes
    served earlier runs starts with their prompts in its prefix cache (none by default)."""
    chosen, roles = policy_and_roles(shape.options(policy))
    speeds = list(latency) if isinstance(latency, Sequence) else [latency] * len(roles)
    if len(speeds) != len(roles):
        raise ValueError(f"policy {policy} runs {len(roles)} workers; got {len(speeds)} latency models")
    if warm and len(warm) != len(roles):
        raise ValueError(f"policy {policy} runs {len(roles)} workers; got warm prompts for {len(warm)}")
    blocks = -(-shape.kv_tokens // shape.block_size)
    base = predictor or speeds[0]
    workers = worker_states(chosen, roles, [(blocks, shape.block_size)] * len(roles), [base] * len(roles),
                            shape.prefix_cache)
    for worker, earlier in zip(workers, warm, strict=False):
        for p in earlier:
            cache_prompt(worker.kv, twin_request(p, slo, shape, seed))
    requests = [twin_request(p, slo, shape, seed, frontend) for p in planned]
    done = Simulator(workers, chosen, requests, shape.max_model_len, truth=speeds).run()
    for req in done:
        req.arrival -= frontend
    return TwinRun(done, GapHistogram.merged(w.gaps.histogram for w in workers))


def twin_request(planned: PlannedRequest, slo: SLO, shape: ServerShape, seed: int,
                 frontend: float = 0.0) -> Request:
    """The twin's request for ``planned``, reaching the cluster ``frontend`` seconds after its send."""
    return Request(planned.id, planned.send_at + frontend, planned.prompt_len, planned.output_len, slo,
                   prefix=prefix_names(planned, shape, seed), prefix_block=shape.block_size)


def cache_prompt(kv: KVPool, req: Request) -> None:
    """``req``'s prompt was computed in ``kv`` and its request has left: its full blocks stay
    cached, unreferenced (free, evicted least recently freed first), as a worker leaves them; a
    prompt already cached there is referenced again, which makes it the most recently freed."""
    if kv.cache is None:
        raise ValueError("a warm start needs the server's prefix cache (ServerShape.prefix_cache)")
    reserved = kv.reserve(req.prompt_len - kv.pin(req))
    kv.release(reserved - kv.store(req, req.prompt_len))
    kv.unpin(req)


def prefix_names(planned: PlannedRequest, shape: ServerShape, seed: int) -> tuple[int, ...]:
    """The names the server gives the blocks of the prompt the client sent for ``planned`` (none
    without a prefix cache). A prompt that shares nothing is named too: its cached blocks take
    room in the server's cache, and evict others, all the same."""
    if not shape.prefix_cache:
        return ()
    return block_hashes(token_ids(planned, seed), shape.block_size)
