"""Pinning workers to nodes and GPUs in --workers, and what each backend makes of the pins."""

from __future__ import annotations

import pytest

from tropical.sched.rules import Role
from tropical.serve.options import ServeOptions, placements, policy_and_roles
from tropical.serve.workers.placement import Placement, check_fits, split_pins


def _node(address: str, cpus: float, gpus: float = 0.0, alive: bool = True) -> dict:
    resources = {"CPU": cpus, f"node:{address}": 1.0} | ({"GPU": gpus} if gpus else {})
    return {"NodeManagerAddress": address, "Alive": alive, "Resources": resources}


def test_pins_follow_the_role_after_at_signs() -> None:
    assert split_pins(" prefill ") == ("prefill", Placement())
    assert split_pins("prefill@node:10.0.0.5") == ("prefill", Placement("10.0.0.5", 0.0))
    assert split_pins("multiplex@gpu") == ("multiplex", Placement(None, 1.0))
    assert split_pins("decode@node:10.0.0.6@gpu:2") == ("decode", Placement("10.0.0.6", 2.0))


@pytest.mark.parametrize("entry", ["prefill@rack:3", "prefill@node:", "prefill@gpu:0", "prefill@gpu:many"])
def test_a_malformed_pin_is_refused_with_the_syntax(entry: str) -> None:
    with pytest.raises(ValueError, match="node:ADDRESS or gpu|positive number of GPUs"):
        split_pins(entry)


def test_a_pin_becomes_ray_resources_named_as_nodes_report_them() -> None:
    assert Placement().demand(cpus=2, default_gpus=0) == {"CPU": 2}
    assert Placement().demand(cpus=1, default_gpus=1) == {"CPU": 1, "GPU": 1}
    assert Placement("10.0.0.5", 2.0).demand(cpus=1, default_gpus=1) == {
        "CPU": 1, "GPU": 2.0, "node:10.0.0.5": 0.001}


def test_pins_go_to_the_policys_workers_of_that_role_in_order() -> None:
    options = ServeOptions(model="tiny-random", policy="disagg", backend="ray",
                           workers="decode@gpu,prefill@node:10.0.0.5,prefill@node:10.0.0.6")
    _, roles = policy_and_roles(options)
    assert roles == [Role.PREFILL, Role.PREFILL, Role.DECODE]
    assert placements(options, roles) == [Placement("10.0.0.5"), Placement("10.0.0.6"), Placement(None, 1.0)]


def test_the_local_backend_refuses_pins_instead_of_ignoring_them() -> None:
    with pytest.raises(ValueError, match="only the Ray backend"):
        ServeOptions(model="tiny-random", policy="disagg", workers="prefill@node:10.0.0.5,decode")
    assert ServeOptions(model="tiny-random", policy="disagg", workers="prefill,decode").backend == "local"


def test_ray_settings_need_the_ray_backend() -> None:
    with pytest.raises(ValueError, match="--ray-address needs --backend ray"):
        ServeOptions(ray_address="10.0.0.1:6379")
    with pytest.raises(ValueError, match="--backend must be one of local, ray"):
        ServeOptions(backend="k8s")


def test_a_worker_no_live_node_can_host_fails_start_up_naming_the_nodes() -> None:
    nodes = [_node("10.0.0.5", 8), _node("10.0.0.6", 8, gpus=4, alive=False)]
    check_fits(0, {"CPU": 2, "node:10.0.0.5": 0.001}, nodes)
    only_live = r"worker 1, which needs CPU 1, GPU 1; live nodes: 10.0.0.5 \(8 CPUs, 0 GPUs\)"
    with pytest.raises(ValueError, match=only_live):
        check_fits(1, {"CPU": 1, "GPU": 1}, nodes)
    with pytest.raises(ValueError, match="node:10.0.0.7"):
        check_fits(2, {"CPU": 1, "node:10.0.0.7": 0.001}, nodes)
