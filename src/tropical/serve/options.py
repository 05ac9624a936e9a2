"""`tropical serve` settings and how they turn into a policy with its worker roles."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from tropical.config import PRESETS, PolicyConfig
from tropical.sched.policy import Policy
from tropical.sched.registry import make_policy
from tropical.sched.rules import Role
from tropical.serve.workers.placement import Placement, split_pins

DEFAULT_WORKERS = {"colocated": "2", "chunked": "2", "disagg": "prefill,decode",
                   "tropical": "prefill,multiplex", "tropical+": "prefill,multiplex"}
BACKENDS = ("local", "ray")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
ENGINES = ("tropical", "vllm", "mock")


@dataclass(frozen=True)
class ServeOptions(PolicyConfig):
    """Everything `tropical serve` can be told: the policy knobs ``tropical sim`` has, and the
    server's own; ``workers`` is a count or a comma list of roles, each optionally pinned
    (``prefill@node:10.0.0.5``, see ``placement``) for the Ray backend."""

    max_batched_tokens: int = 2048
    model: str = "smollm2"
    workers: str | None = None
    threads: int = 1
    profile: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    api_key_file: str | None = None
    max_body_mb: float = 4.0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_scale: float = 5.0
    tbt_scale: float = 5.0
    kv_tokens: int = 16384
    block_size: int = 16
    max_model_len: int = 4096
    max_waiting: int = 256
    dtype: str = "float32"
    device: str = "cpu"
    start_timeout: float = 300.0
    drain_timeout: float = 30.0
    served_model_name: str | None = None
    backend: str = "local"
    ray_address: str | None = None
    ray_max_restarts: int = 3
    engine: str = "tropical"
    worker_urls: str | None = None
    vllm_python: str = ".venv-vllm/bin/python"
    vllm_out: str = "out/serve-vllm"
    nixl_poll_delay_us: int = 0
    iteration_log: str | None = None
    prefix_cache: bool = True
    mock_cluster: str = "paper"
    mock_time_scale: float = 1.0
    max_logprobs: int = 20
    max_n: int = 16
    logprobs_mode: str = "raw_logprobs"

    def __post_init__(self) -> None:
        positive = ("threads", "kv_tokens", "block_size", "max_model_len", "max_batched_tokens",
                    "chunk_budget", "max_seqs", "max_waiting", "max_n")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not self.max_body_mb > 0:
            raise ValueError(f"--max-body-mb must be more than 0, got {self.max_body_mb}")
        self._check_api()
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"--dtype must be float32 or bfloat16, got {self.dtype!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.ray_address is not None and self.backend != "ray":
            raise ValueError("--ray-address needs --backend ray")
        if self.backend == "ray" and importlib.util.find_spec("ray") is None:
            raise ValueError("--backend ray needs Ray; install it with: pip install 'tropical[ray]'")
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.worker_urls is not None and self.engine != "vllm":
            raise ValueError("--worker-urls needs --engine vllm")
        if self.worker_urls is not None and self.workers is not None:
            raise ValueError("--worker-urls already names each worker's role; drop --workers")
        if self.nixl_poll_delay_us and (self.engine != "vllm" or self.device != "cpu"):
            raise ValueError("--nixl-poll-delay-us is a CPU workaround for vLLM's NIXL connector: "
                             "it needs --engine vllm on --device cpu")
        if self.admission != "none" and self.engine == "vllm":
            raise ValueError("--admission refuses requests from the router's own view of every queue: it "
                             "needs --engine tropical or mock (a vLLM instance queues what it was sent)")
        if self.iteration_log is not None and self.engine == "vllm":
            raise ValueError("--iteration-log records the iterations the router plans: it needs "
                             "--engine tropical or mock")
        self._check_mock()
        if self.ray_max_restarts < -1:
            raise ValueError(f"--ray-max-restarts must be -1 (no limit) or more, got {self.ray_max_restarts}")
        placements(self, policy_and_roles(self)[1])

    def _check_api(self) -> None:
        if self.max_logprobs < 0:
            raise ValueError(f"--max-logprobs must be at least 0, got {self.max_logprobs}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"--logprobs-mode must be one of {', '.join(LOGPROBS_MODES)}, "
                             f"got {self.logprobs_mode!r}")

    def _check_mock(self) -> None:
        if self.engine != "mock":
            if (self.mock_cluster, self.mock_time_scale) != ("paper", 1.0):
                raise ValueError("--mock-cluster and --mock-time-scale set up mock workers: they need "
                                 "--engine mock")
            return
        if self.mock_cluster not in PRESETS:
            raise ValueError(f"--mock-cluster must be one of {', '.join(PRESETS)}, got {self.mock_cluster!r}")
        if not self.mock_time_scale > 0:
            raise ValueError(f"--mock-time-scale must be more than 0, got {self.mock_time_scale}")
        if self.backend != "local":
            raise ValueError("mock workers run on the router's own event loop: --engine mock needs "
                             "--backend local")

    @property
    def ttft_scale(self) -> float:
        """``--slo-scale`` scales the TTFT and the TPOT targets alike (see ``config.slo_spec``)."""
        return self.slo_scale

    @property
    def tpot_scale(self) -> float:
        return self.slo_scale


def policy_and_roles(options: ServeOptions) -> tuple[Policy, list[Role]]:
    """The policy object and each worker's role, checked against what ``--workers`` asked for."""
    spec = _spec(options)
    if spec.strip().isdigit():
        count, wanted = int(spec), None
    else:
        wanted = [_role(split_pins(entry)[0]) for entry in spec.split(",")]
        count = len(wanted)
    if count < 1:
        raise ValueError("--workers needs at least one worker")
    prefill = None if wanted is None else wanted.count(Role.PREFILL) or None
    policy = make_policy(options.policy, options.policy_params(prefill))
    try:
        roles = policy.roles(count)
    except ValueError as exc:
        raise ValueError(f"--workers {spec!r} does not suit policy {options.policy}: {exc}") from None
    if wanted is not None and sorted(roles) != sorted(wanted):
        raise ValueError(f"policy {options.policy} runs workers as {','.join(r.value for r in roles)}; "
                         f"--workers asked for {spec}")
    return policy, roles


def placements(options: ServeOptions, roles: list[Role]) -> list[Placement]:
    """Each worker's pins, in the policy's order of ``roles`` (the n-th pinned prefill entry goes
    to the n-th prefill worker); pins need the Ray backend."""
    spec = _spec(options)
    pinned: dict[Role, list[Placement]] = {}
    if not spec.strip().isdigit():
        for entry in spec.split(","):
            name, placement = split_pins(entry)
            pinned.setdefault(_role(name), []).append(placement)
    chosen = [pinned[role].pop(0) if pinned.get(role) else Placement() for role in roles]
    if options.backend == "local" and any(p.pinned for p in chosen):
        raise ValueError(f"--workers {spec!r} pins workers to nodes or GPUs, which only the Ray backend "
                         f"can honour; add --backend ray or drop the @ pins")
    return chosen


def _spec(options: ServeOptions) -> str:
    return options.workers or DEFAULT_WORKERS.get(options.policy, "2")


def _role(name: str) -> Role:
    try:
        return Role(name.strip().lower())
    except ValueError:
        choices = ", ".join(r.value for r in Role)
        raise ValueError(f"unknown worker role {name.strip()!r} in --workers; choose from {choices}"
                         ) from None
