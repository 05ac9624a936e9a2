"""Policies by name: the registered ones and the disagg baseline at any role split."""

from __future__ import annotations

import pytest

from tropical.sched.registry import make_policy, policy_names
from tropical.sched.rules import Role
from tropical.sim.reproduce import BASELINES, baselines, best_of, policies


def test_disagg_names_its_prefill_workers() -> None:
    policy = make_policy("disagg-3p")
    assert policy.name == "disagg-3p"
    assert policy.roles(4) == [Role.PREFILL] * 3 + [Role.DECODE]
    assert make_policy("disagg").roles(4) == [Role.PREFILL] * 2 + [Role.DECODE] * 2
    with pytest.raises(ValueError, match="need 1..3 prefill workers of 4"):
        make_policy("disagg-4p").roles(4)


@pytest.mark.parametrize("name", ["disagg-0p", "disagg-p", "disagg-3", "fastest"])
def test_unknown_names_say_what_is_known(name: str) -> None:
    with pytest.raises(ValueError, match="unknown policy .* or disagg-<k>p"):
        make_policy(name)


def test_every_registered_name_builds_a_policy_of_that_name() -> None:
    assert all(make_policy(name).name == name for name in policy_names())


def test_a_reproduction_gives_disagg_the_splits_a_setting_may_favour() -> None:
    assert baselines(2) == BASELINES, "on two workers half is the only split"
    assert baselines(4) == (*BASELINES, "disagg-1p", "disagg-3p")
    assert baselines(8) == (*BASELINES, "disagg-2p", "disagg-6p")
    assert policies(4)[-2:] == ("tropical", "tropical+")
    assert best_of({"disagg-3p": 0.7, "chunked-512": 0.5, "tropical+": 1.1}) == 0.7
