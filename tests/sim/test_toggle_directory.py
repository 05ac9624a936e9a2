"""The toggle on the paper cluster keeps no prefix directory (``TropicalPolicy.keeps_directory``):
it read the directory only for floors, and with two workers of each role every worker is priced
exactly whatever the floors say, so it decides exactly as it did with one."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from unittest import mock

import pytest

from tropical.config import SimConfig
from tropical.sched.prefix_directory import PrefixDirectory
from tropical.sched.tropical import TropicalPolicy
from tropical.sim.build import experiment
from tropical.sim.run import simulate


def decided(policy: str, directory: bool) -> tuple[list[tuple], int]:
    """Every request's path, workers, hit and times on the first 1,000 conversation requests at
    the trace's rate, and how many blocks entered a directory."""
    added = []
    add = PrefixDirectory.add

    def counted(self: PrefixDirectory, key: object, worker_id: int) -> None:
        added.append(key)
        add(self, key, worker_id)

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(PrefixDirectory, "add", counted))
        if directory:
            keeps = mock.patch.object(TropicalPolicy, "keeps_directory", lambda self, roles: True)
            stack.enter_context(keeps)
        result = simulate(experiment(replace(SimConfig().with_preset(), limit=1000)).with_policy(policy))
    return [(r.id, r.path, r.prefill_worker, r.decode_worker, r.cached, r.first_token, r.finish)
            for r in result.requests], len(added)


@pytest.mark.parametrize("policy", ["tropical+", "tropical"])
def test_the_paper_cluster_decides_alike_with_and_without_the_directory(policy: str):
    without, indexed_without = decided(policy, directory=False)
    with_it, indexed_with = decided(policy, directory=True)
    assert indexed_without == 0 and indexed_with > 1000
    assert without == with_it
