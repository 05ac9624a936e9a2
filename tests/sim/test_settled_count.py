"""The simulator counts the decode runs it books in part to bring workers up to date for a
decision (benchmarks/scale.py reads it to tell the simulator's work from the cluster's)."""

from tests.factories import linear_model, make_request
from tropical.core.specs import ReplicaSpec, hardware
from tropical.models import load_model_spec
from tropical.sched.registry import make_policy
from tropical.sim.cluster import ClusterSpec, WorkerSpec
from tropical.sim.simulator import Simulator

REPLICA = ReplicaSpec(load_model_spec("llama-2-7b"), hardware("a100"), tp=1)


def simulated(step_by_step: bool, gap: float) -> Simulator:
    """One worker decoding long outputs while requests keep arriving ``gap`` apart."""
    policy = make_policy("colocated")
    workers = ClusterSpec("test", (WorkerSpec(REPLICA, linear_model(), 50_000),)).build(policy)
    requests = [make_request(i, arrival=gap * i, prompt=64, output=200) for i in range(6)]
    sim = Simulator(workers, policy, requests, step_by_step=step_by_step)
    sim.run()
    return sim


def test_arrivals_in_the_middle_of_a_decode_run_settle_part_of_it():
    assert simulated(step_by_step=False, gap=0.37).settled > 0


def test_one_event_per_iteration_leaves_nothing_to_settle():
    assert simulated(step_by_step=True, gap=0.37).settled == 0
