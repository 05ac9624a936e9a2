"""The simulator counts the decode runs it books in part to bring a worker up to date for a
decision that read it (benchmarks/scale.py reads it to tell the simulator's work from the
cluster's): a dispatch by load reads loads, which need no booking; a decision that plans a
worker's next iteration books what its run completed by then."""

from tests.factories import linear_model, make_request
from tropical.core.specs import ReplicaSpec, hardware
from tropical.models import load_model_spec
from tropical.sched.registry import make_policy
from tropical.sim.cluster import ClusterSpec, WorkerSpec
from tropical.sim.simulator import Simulator

REPLICA = ReplicaSpec(load_model_spec("llama-2-7b"), hardware("a100"), tp=1)


def simulated(policy_name: str, workers: int, step_by_step: bool) -> Simulator:
    """Workers decoding long outputs while requests keep arriving in the middle of their runs."""
    policy = make_policy(policy_name)
    states = ClusterSpec("test", (WorkerSpec(REPLICA, linear_model(), 50_000),) * workers).build(policy)
    requests = [make_request(i, arrival=0.37 * i, prompt=64, output=200) for i in range(6)]
    sim = Simulator(states, policy, requests, step_by_step=step_by_step)
    sim.run()
    return sim


def test_a_dispatch_by_load_in_the_middle_of_a_decode_run_books_none_of_it():
    assert simulated("colocated", 1, step_by_step=False).settled == 0


def test_a_hand_off_that_plans_the_decoding_worker_books_what_its_run_completed():
    assert simulated("tropical", 2, step_by_step=False).settled > 0


def test_one_event_per_iteration_leaves_nothing_to_book():
    assert simulated("tropical", 2, step_by_step=True).settled == 0
