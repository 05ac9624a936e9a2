"""Price a recorded study again without its server: `tropical fidelity --replay DIR`.

A study leaves, per run, what the client measured of every request (``requests.jsonl``), every
iteration the server ran (its iteration log) and the front-end latency it measured
(``fidelity.json``). That is all the twin needs, so a change to the simulator, the policy or the
way the twin is priced can be checked on the very runs the study made, in seconds, instead of
another hour of live runs on a quiet machine.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from tropical.bench.plan import PlannedRequest
from tropical.bench.record import Measurement
from tropical.calibration.store import load_profile
from tropical.core.latency.fitted import FittedModel
from tropical.core.slo import SLO
from tropical.fidelity.compare import Comparison
from tropical.fidelity.overheads import measured_speed, profile_ratio
from tropical.fidelity.repeats import PolicyRepeats
from tropical.fidelity.run import RecordedRun, price_run
from tropical.fidelity.twin import ServerShape
from tropical.serve.iteration_log import read_iterations
from tropical.serve.options import policy_and_roles

STUDY = "study.json"  # the study's settings, written before its first run
TWIN = "twin.json"  # a run's comparison with its twin, written as the run ends
HOST_PROFILE = "profile-host.json"  # a matched study's profile, in this host's time units


def replay_study(out: Path) -> tuple[dict[str, Any], list[PolicyRepeats]]:
    """The study recorded in ``out`` priced again, from its settings and every run that finished
    (a run's ``twin.json`` is written last); returns the settings and every policy's repeats."""
    config = json.loads((out / STUDY).read_text())["config"]
    # Studies from before the prefix cache name none: their servers had none.
    shape = ServerShape(config["kv_tokens"], 16, config["max_model_len"], config["max_batched_tokens"],
                        config["workers"], config.get("prefix_cache", "off") == "on")
    slo = SLO(config["slo_ttft_ms"] / 1e3, config["slo_tpot_ms"] / 1e3)
    profile = load_profile(study_profile(config, out))
    policies = []
    for policy in (p.strip() for p in config["policies"].split(",") if p.strip()):
        runs = [_price(out, policy, k, shape, slo, profile) for k in _finished(out / policy)]
        if runs:
            policies.append(PolicyRepeats(policy, tuple(runs)))
    if not policies:
        raise ValueError(f"{out}: no finished run to replay (each leaves <policy>/<repeat>/{TWIN})")
    return config, policies


def study_profile(config: dict[str, Any], out: Path) -> Path:
    """The profile a study's policies decided with. One the study measured, or matched to its
    host, lies in its folder and is read from there, so that a study copied elsewhere (into the
    docs, onto another machine) still replays."""
    if not config["profile"]:
        return out / "profile.json"
    if config.get("host", {}).get("matched"):
        return out / HOST_PROFILE
    return Path(config["profile"])


def _finished(runs: Path) -> list[int]:
    """The repeats, from 1, whose runs finished (a study cut short leaves a run half done)."""
    return list(itertools.takewhile(lambda k: (runs / str(k) / TWIN).exists(), itertools.count(1)))


def _price(out: Path, policy: str, repeat: int, shape: ServerShape, slo: SLO,
           profile: FittedModel) -> Comparison:
    recorded = json.loads((out / policy / str(repeat) / TWIN).read_text())
    frontend = recorded["adjustment"]["frontend_s"]
    transfer = recorded["adjustment"].get("transfer_scale", 1.0)  # older studies moved KV as profiled
    workers = len(policy_and_roles(shape.options(policy))[1])
    records = read_iterations(iteration_log(out, policy, repeat))
    speeds = measured_speed(profile, records, workers, transfer)
    return price_run(load_run(out / policy / str(repeat), slo), policy, shape, profile, speeds, frontend,
                     profile_ratio(profile, records))


def iteration_log(out: Path, policy: str, repeat: int) -> Path:
    """Where a study's run left its server's iteration log (gzipped once published)."""
    log = out / "logs" / f"serve-{policy}-{repeat}.iterations.jsonl"
    log = log if log.exists() else log.with_suffix(".jsonl.gz")
    if not log.exists():
        raise ValueError(f"{log}: missing; a study can be replayed only if its server logged its iterations")
    return log


def load_run(run_dir: Path, slo: SLO) -> RecordedRun:
    """A run's planned requests and client measurements from its ``requests.jsonl``."""
    lines = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    planned = [PlannedRequest(x["id"], x["scheduled_s"], x["prompt_tokens"], x["max_tokens"],
                              tuple(x.get("prefix_blocks") or ()), x["capped"]) for x in lines]
    return RecordedRun(planned, [_measurement(x) for x in lines], slo)


def _measurement(x: dict[str, Any]) -> Measurement:
    chunks = x["chunk_times_s"]
    counts = x["chunk_tokens"] or [None] * len(chunks)
    end = chunks[-1] if chunks else x["sent_s"]
    return Measurement(x["id"], x["prompt_tokens"], x["max_tokens"], x["sent_s"], chunks, counts,
                       x["completion_tokens"], saw_done=x["error"] is None, error=x["error"], end=end,
                       path=x.get("path"), prefill_worker=x.get("prefill_worker"), reason=x.get("reason"),
                       cached_tokens=x.get("cached_tokens"))
