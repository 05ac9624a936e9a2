from dataclasses import replace

from tests.benchmarks.scripts import load
from tropical.config import SimConfig
from tropical.core.capacity import CapacityResult
from tropical.sched.rejection import AdmissionMode
from tropical.sim.build import experiment
from tropical.sim.sweep import PolicyCapacity

adm = load("admission_capacity")


def test_the_run_at_a_capacity_reports_refusals_only_where_admission_refuses():
    base = experiment(SimConfig(limit=300).with_preset()).with_policy("tropical+")
    found = PolicyCapacity("tropical+", CapacityResult(2.0), base.trace.mean_rate)
    tails = {mode: adm.at_capacity(replace(base, params=replace(base.params, admission=mode)), found)
             for mode in (AdmissionMode.NONE, AdmissionMode.EARLY_REJECT)}
    assert set(tails[AdmissionMode.NONE]) == set(adm.TAIL)
    assert tails[AdmissionMode.NONE]["rejection_rate"] == 0.0
    assert tails[AdmissionMode.EARLY_REJECT]["rejection_rate"] > 0.0
    assert tails[AdmissionMode.EARLY_REJECT]["ttft_max_s"] < tails[AdmissionMode.NONE]["ttft_max_s"]


def test_each_row_sets_a_capacity_beside_none_s_and_the_tail_there():
    tail = {"attainment": 0.9, "rejection_rate": 0.087, "ttft_p50_s": 1.04, "ttft_p99_s": 30.6,
            "ttft_max_s": 127.0}
    rps = {("tropical+", "none"): 2.0, ("tropical+", "early-reject"): 2.5}
    rows = adm.rows(rps, {key: tail for key in rps})
    assert rows[1] == ["tropical+", "early-reject", "2.500", "1.250", "8.7%", "1.04", "30.6", "127"]
