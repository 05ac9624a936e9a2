"""The compiled simulator: it runs only for the sources it was built from, and decides exactly
as the plain sources do, in one process and across a sweep's processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tropical import native
from tropical.cli import main

TROPICAL = str(Path(sys.executable).with_name("tropical"))
POLICIES = ("colocated", "disagg", "chunked-512", "tropical", "tropical+")
FINGERPRINT = """
import hashlib, json, sys
from dataclasses import replace
from tropical.config import SimConfig
from tropical.native import running
from tropical.sched.slack import SlackRule
from tropical.sim.build import experiment
from tropical.sim.run import simulate
base = experiment(SimConfig(limit=400).with_preset())
toggle = base.params.toggle
ablations = {"banked+demote": replace(toggle, slack=SlackRule.BANKED, demote_doomed=True),
             "correct": replace(toggle, correct=True), "flex": replace(toggle, flex=True, chunked=True)}
runs = {p: base.with_policy(p) for p in sys.argv[1:]}
runs.update({f"tropical {name}": replace(base.with_policy("tropical"), predictor_noise=0.2,
                                         params=replace(base.params, toggle=t))
             for name, t in ablations.items()})
out = {}
for name, exp in runs.items():
    for scale in (0.35, 1.0):
        reqs = simulate(exp.at_rate(scale)).requests
        decided = repr([(r.id, r.first_token, r.finish, r.path.value, r.max_gap) for r in reqs])
        out[f"{name}@{scale}"] = hashlib.sha256(decided.encode()).hexdigest()
print(json.dumps({"running": running(), "fingerprints": out}))
"""


def _fake_package(root: Path) -> Path:
    package = root / "tropical"
    for name in ("core/request.py", "sched/worker.py", "sim/simulator.py", "sim/decode_run.py",
                 "sim/event.py", "sim/cluster.py", "data/trace.json"):
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(f"# {name}\n")
    return package


def test_the_key_follows_every_source_and_data_file_but_not_bytecode(tmp_path):
    package = _fake_package(tmp_path)
    key = native.source_key(package)
    (package / "core" / "__pycache__").mkdir()
    (package / "core" / "__pycache__" / "request.cpython-311.pyc").write_bytes(b"\0")
    (package / "sched" / "worker.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\0")
    assert native.source_key(package) == key
    (package / "data" / "trace.json").write_text("[]")
    edited = native.source_key(package)
    assert edited != key
    (package / "sim" / "simulator.py").write_text("# changed\n")
    assert native.source_key(package) not in (key, edited)


def test_the_compiled_modules_are_the_pure_layers_and_the_simulator_s_loop():
    compiled = native.modules()
    assert "sched/tropical.py" in compiled and "sim/simulator.py" in compiled
    assert "sched/rules.py" in compiled and "core/latency/model.py" in compiled
    assert "sim/event.py" in compiled
    assert not any(m.startswith(("serve/", "engine/", "bench/")) for m in compiled)


def test_a_build_that_mypyc_refuses_names_the_cause(tmp_path, monkeypatch):
    monkeypatch.setenv("TROPICAL_NATIVE_DIR", str(tmp_path / "builds"))
    package = _fake_package(tmp_path)
    (package / "core" / "request.py").write_text("x: int = 'not an int'\n")
    with pytest.raises(native.BuildError, match="(?s)mypyc could not compile.*request.py"):
        native.build(package)
    assert not any(p for p in (tmp_path / "builds").iterdir() if not p.name.startswith("."))


def test_status_says_whether_it_is_built_and_running(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TROPICAL_NATIVE_DIR", str(tmp_path))
    assert main(["native", "status"]) == 0
    assert "not built" in capsys.readouterr().out
    assert not native.running()


@pytest.fixture(scope="module")
def native_env(tmp_path_factory) -> dict[str, str]:
    """An environment whose processes run the compiled build (the set-up's, else a new one)."""
    env = {k: v for k, v in os.environ.items() if k != "TROPICAL_NATIVE"}
    if not native.status().built:
        env["TROPICAL_NATIVE_DIR"] = str(tmp_path_factory.mktemp("native"))
        done = subprocess.run([TROPICAL, "native", "build"], env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    return env


def _run(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_compiled_runs_decide_exactly_as_plain_ones(native_env):
    argv = [sys.executable, "-c", FINGERPRINT, *POLICIES]
    compiled = json.loads(_run(argv, native_env))
    plain = json.loads(_run(argv, {**native_env, "TROPICAL_NATIVE": "0"}))
    assert compiled["running"] and not plain["running"]
    assert compiled["fingerprints"] == plain["fingerprints"]


def test_a_compiled_sweep_sends_its_experiments_to_other_processes(native_env):
    argv = [TROPICAL, "sweep", "--limit", "200", "--policies", "disagg,tropical+",
            "--jobs", "2", "--json"]
    compiled = json.loads(_run(argv, native_env))
    plain = json.loads(_run(argv, {**native_env, "TROPICAL_NATIVE": "0"}))
    assert compiled == plain


WHOLE_RESULT = """
import json, pickle
from tropical.config import SimConfig
from tropical.native import running
from tropical.sim.build import experiment
from tropical.sim.run import simulate
run = simulate(experiment(SimConfig(limit=50).with_preset()).with_policy("tropical+"))
back = pickle.loads(pickle.dumps(run))
seen = lambda result: [(r.id, r.slo.ttft, r.slo.tpot, r.first_token) for r in result.requests]
print(json.dumps({"running": running(), "same": seen(back) == seen(run)}))
"""


def test_a_compiled_result_crosses_processes_whole(native_env):
    """``tropical reproduce`` sends whole results, requests and their SLOs, between processes."""
    assert json.loads(_run([sys.executable, "-c", WHOLE_RESULT], native_env)) == {"running": True,
                                                                                  "same": True}


def test_a_build_that_does_not_load_falls_back_to_the_plain_sources(tmp_path):
    broken = tmp_path / native.source_key() / "tropical"
    broken.mkdir(parents=True)
    env = {**os.environ, "TROPICAL_NATIVE_DIR": str(tmp_path)}
    env.pop("TROPICAL_NATIVE")
    done = subprocess.run([sys.executable, "-c", "from tropical.native import running\n"
                           "from tropical.sched.worker import WorkerState\nprint(running())"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert "does not load" in done.stderr and str(broken.parent) in done.stderr
