"""How a vLLM instance is started: roles to connector roles, cores, ports, the CPU patch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tropical.sched.rules import Role
from tropical.serve.options import ServeOptions
from tropical.serve.vllm.launch import one_block_size, parse_worker_urls
from tropical.serve.vllm.process import CPU_PATCH, VllmLaunch, VllmProcess, core_sets


def launch(role: Role, delay: int = 0) -> VllmLaunch:
    return VllmLaunch("py", "/m", "smollm2", role, 8001, 5601, "1", Path("/tmp/log"),
                      nixl_poll_delay_us=delay)


def connector(args: list[str]) -> dict | None:
    flag = "--kv-transfer-config"
    return json.loads(args[args.index(flag) + 1]) if flag in args else None


@pytest.mark.parametrize(("role", "kv_role"), [(Role.PREFILL, "kv_producer"), (Role.DECODE, "kv_consumer"),
                                               (Role.MULTIPLEX, "kv_both"), (Role.COLOCATED, None)])
def test_each_role_gets_its_nixl_connector_role(role: Role, kv_role: str | None) -> None:
    config = connector(launch(role).command())
    assert (config or {}).get("kv_role") == kv_role
    if config:
        assert config["kv_connector"] == "NixlConnector" and config["kv_buffer_device"] == "cpu"


def test_each_instance_is_bound_to_its_cores_with_its_own_side_channel() -> None:
    env = launch(Role.PREFILL).environment({})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert "TROPICAL_NIXL_POLL_DELAY_US" not in env, "the poll delay is opt-in"


@pytest.mark.parametrize(("role", "patched"), [(Role.PREFILL, True), (Role.MULTIPLEX, True),
                                               (Role.COLOCATED, False)])
def test_every_instance_with_a_kv_connector_gets_the_cpu_patch(role: Role, patched: bool) -> None:
    path = launch(role).environment({"PYTHONPATH": "/elsewhere"}).get("PYTHONPATH", "")
    assert path.split(os.pathsep)[0] == str(CPU_PATCH) if patched else CPU_PATCH.name not in path
    assert path.endswith("/elsewhere")


def test_cores_are_split_between_instances() -> None:
    assert core_sets(2, [0, 1]) == ["0", "1"]
    assert core_sets(2, [0, 1, 2, 3, 4]) == ["0,1", "2,3"]
    assert core_sets(3, [0, 1]) == ["0", "1", "0"]


def test_worker_urls_name_roles_and_bad_entries_are_refused() -> None:
    assert parse_worker_urls("prefill=http://a:1,multiplex=http://b:2/") == [
        (Role.PREFILL, "http://a:1"), (Role.MULTIPLEX, "http://b:2")]
    with pytest.raises(ValueError, match="ROLE=http"):
        parse_worker_urls("prefill:http://a:1")
    with pytest.raises(ValueError, match="unknown role 'decoder'"):
        parse_worker_urls("decoder=http://a:1")
    with pytest.raises(ValueError, match="needs --engine vllm"):
        ServeOptions(worker_urls="prefill=http://a:1")
    with pytest.raises(ValueError, match="drop --workers"):
        ServeOptions(engine="vllm", workers="2", worker_urls="prefill=http://a:1")
    with pytest.raises(ValueError, match="CPU workaround"):
        ServeOptions(engine="vllm", device="cuda", nixl_poll_delay_us=1000)


FAKE_NIXL_API = """
class _Binding:
    class nixlAgentConfig:
        pthrDelay = 0
    @staticmethod
    def nixlAgent(name, config):
        return config.pthrDelay
nixlBind = _Binding
def make_agent():
    return nixlBind.nixlAgent("a", nixlBind.nixlAgentConfig())
"""


@pytest.mark.parametrize("delay", [0, 1000])
def test_the_cpu_patch_gives_nixl_agents_the_poll_delay_only_when_asked(tmp_path: Path, delay: int) -> None:
    (tmp_path / "nixl_cu12").mkdir()
    (tmp_path / "nixl_cu12" / "__init__.py").write_text("")
    (tmp_path / "nixl_cu12" / "_api.py").write_text(FAKE_NIXL_API)
    env = launch(Role.PREFILL, delay).environment({"PYTHONPATH": str(tmp_path)})
    out = subprocess.run([sys.executable, "-c", "import nixl_cu12._api as a; print(a.make_agent())"],
                         env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(delay)


FAKE_NIXL_WORKER = """
import os
class NixlBaseConnectorWorker:
    def __init__(self, engine_id):
        os.sched_setaffinity(0, {LAST})  # vLLM's: the last core of the NUMA node, for KV transfers
        self.engine_id = engine_id
"""
NIXL_WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"  # vLLM 0.32's module
MAKE_WORKER = (f"import os; os.sched_setaffinity(0, {{CORE}}); "
               f"from {NIXL_WORKER} import NixlBaseConnectorWorker as W; "
               f"w = W('e'); print(w.engine_id, *sorted(os.sched_getaffinity(0)))")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to move between")
def test_the_cpu_patch_keeps_the_model_thread_on_its_cores_through_the_nixl_worker(tmp_path: Path) -> None:
    """vLLM's NIXL connector worker moves the calling thread (the one that runs the model) to the
    last core; with the patch it stays on the cores it was bound to."""
    package = tmp_path.joinpath(*NIXL_WORKER.split(".")[:-1])
    package.mkdir(parents=True)
    for folder in [package, *package.relative_to(tmp_path).parents][:-1]:
        (tmp_path / folder / "__init__.py").write_text("")
    first, last = min(os.sched_getaffinity(0)), max(os.sched_getaffinity(0))
    (package / "base_worker.py").write_text(FAKE_NIXL_WORKER.replace("LAST", str(last)))
    code = MAKE_WORKER.replace("CORE", str(first))
    patched = launch(Role.PREFILL).environment({"PYTHONPATH": str(tmp_path)})
    for env, cores in [(patched, str(first)), ({"PYTHONPATH": str(tmp_path)}, str(last))]:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             check=True)
        assert out.stdout.split() == ["e", cores]


CHILD_AND_SLEEP = ("import subprocess, sys, time; "
                   "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                   "print(child.pid, flush=True); time.sleep(60)")


def test_stopping_an_instance_ends_its_whole_process_group_even_when_its_leader_is_gone() -> None:
    leader = subprocess.Popen([sys.executable, "-c", CHILD_AND_SLEEP], start_new_session=True,
                              stdout=subprocess.PIPE, text=True)
    with leader.stdout:
        grandchild = int(leader.stdout.readline())  # printed once the leader has started it
    assert os.getpgid(grandchild) == leader.pid, "the grandchild must be in the group to be stopped"
    process = VllmProcess(launch(Role.PREFILL), leader)
    os.kill(process.pid, signal.SIGKILL)
    process.stop(timeout=5)
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)


@pytest.mark.parametrize(("on", "flag"), [(True, "--enable-prefix-caching"),
                                          (False, "--no-enable-prefix-caching")])
def test_instances_cache_prefixes_as_told_and_report_their_hits(on: bool, flag: str) -> None:
    args = VllmLaunch("py", "/m", "smollm2", Role.COLOCATED, 8001, 5601, "1", Path("/tmp/log"),
                      prefix_cache=on).command()
    assert flag in args and "--enable-prompt-tokens-details" in args


def test_instances_of_different_block_sizes_are_refused_with_the_prefix_cache_on() -> None:
    one_block_size([(100, 128), (50, 128)], True)
    one_block_size([(100, 128), (50, 16)], False)
    with pytest.raises(ValueError, match="different KV block sizes .16, 128 tokens"):
        one_block_size([(100, 128), (50, 16)], True)
