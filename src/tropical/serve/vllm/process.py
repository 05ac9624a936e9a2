"""Start one vLLM OpenAI server as a child process: its command line, environment and log.

A worker's role becomes its NIXL connector role (prefill → kv_producer, decode → kv_consumer,
multiplex → kv_both, since it also prefills locally; colocated → no connector). Its prefix cache
is on (vLLM's default, said explicitly) or off as ``--prefix-cache`` says, and its usage reports
the prompt tokens it found cached (``--enable-prompt-tokens-details``), which is how the router
learns its hits. Each instance is pinned to its own cores through vLLM's CPU thread binding
(``VLLM_CPU_OMP_THREADS_BIND``), kept there against vLLM's NIXL connector by ``cpu_patch``, and
gets its own NIXL side-channel port. The process runs in its own session, so stopping its process
group stops vLLM's engine-core child too; and it gets SIGTERM if the router dies first (Linux's
parent-death signal), so a router killed while starting leaves no vLLM behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tropical.sched.rules import Role
from tropical.serve.parent_death import terminate_with_parent

KV_ROLES = {Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer", Role.MULTIPLEX: "kv_both"}
CPU_PATCH = Path(__file__).parent / "cpu_patch"
"""The NIXL CPU workarounds (its sitecustomize: each instance keeps its cores; the opt-in poll
delay), put on the path of every vLLM process with a KV connector."""
KV_CACHE_GIB = 1
"""vLLM's CPU KV cache per instance (``VLLM_CPU_KVCACHE_SPACE``): ~23k tokens of SmolLM2 in fp32."""


@dataclass(frozen=True, slots=True)
class VllmLaunch:
    """What one instance serves, where, on which cores, and where its output goes."""

    python: str
    model_dir: str
    served_name: str
    role: Role
    port: int
    side_channel_port: int
    cores: str
    log: Path
    dtype: str = "float32"
    max_model_len: int = 2048
    max_batched_tokens: int = 2048
    kv_cache_gib: int = KV_CACHE_GIB
    nixl_poll_delay_us: int = 0
    prefix_cache: bool = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        args = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
                "--served-model-name", self.served_name, "--dtype", self.dtype,
                "--max-model-len", str(self.max_model_len),
                "--max-num-batched-tokens", str(self.max_batched_tokens),
                "--host", "127.0.0.1", "--port", str(self.port), "--enable-prompt-tokens-details",
                "--enable-prefix-caching" if self.prefix_cache else "--no-enable-prefix-caching"]
        if self.role in KV_ROLES:
            config = {"kv_connector": "NixlConnector", "kv_role": KV_ROLES[self.role],
                      "kv_buffer_device": "cpu"}
            args += ["--kv-transfer-config", json.dumps(config)]
        return args

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        env = {**base, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
               "VLLM_CPU_OMP_THREADS_BIND": self.cores, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
               "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
               "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_channel_port)}
        if self.role in KV_ROLES:
            env["PYTHONPATH"] = os.pathsep.join([str(CPU_PATCH), *filter(None, [base.get("PYTHONPATH")])])
            if self.nixl_poll_delay_us:
                env["TROPICAL_NIXL_POLL_DELAY_US"] = str(self.nixl_poll_delay_us)
        return env


def core_sets(instances: int, cpus: list[int]) -> list[str]:
    """Split the CPUs this process may use into one contiguous set per instance (shared round
    robin when there are fewer CPUs than instances)."""
    if len(cpus) < instances:
        return [str(cpus[i % len(cpus)]) for i in range(instances)]
    share = len(cpus) // instances
    return [",".join(str(c) for c in cpus[i * share:(i + 1) * share]) for i in range(instances)]


@dataclass(eq=False)
class VllmProcess:
    """A running instance's process; ``stop`` ends its whole process group."""

    launch: VllmLaunch
    process: subprocess.Popen

    @classmethod
    def start(cls, launch: VllmLaunch) -> VllmProcess:
        launch.log.parent.mkdir(parents=True, exist_ok=True)
        with launch.log.open("w") as out:
            process = subprocess.Popen(launch.command(), env=launch.environment(dict(os.environ)),
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                       preexec_fn=terminate_with_parent())
        return cls(launch, process)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 20) -> str:
        text = self.launch.log.read_text(errors="replace") if self.launch.log.is_file() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the process group, SIGKILL if any of it lingers; the group is signalled even
        when the server itself is gone, since its engine-core child may outlive it."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            deadline = time.monotonic() + timeout
            try:
                os.killpg(self.pid, sig)
                while time.monotonic() < deadline:
                    self.process.poll()
                    os.killpg(self.pid, 0)
                    time.sleep(0.1)
            except ProcessLookupError:
                return
