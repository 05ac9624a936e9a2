"""Policies by name: the registered ones and the disagg baseline at any role split."""

from __future__ import annotations

import math

import pytest

from tropical.config import SimConfig
from tropical.sched.pools import PooledPolicy
from tropical.sched.registry import PLUS_PREFILL_BUDGET, PLUS_SIZE_WEIGHT, make_policy, policy_names
from tropical.sched.rules import LATEST_START, BatchRules, Role
from tropical.sched.tropical import ToggleParams, TropicalPolicy
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


def _toggle(name: str, **flags: object) -> ToggleParams:
    policy = make_policy(name, SimConfig().updated(flags, "test").policy_params())
    assert isinstance(policy, TropicalPolicy)
    return policy.toggle


def test_tropical_plus_demotes_and_batches_short_by_default_and_its_flags_override() -> None:
    plus = _toggle("tropical+")
    assert (plus.demote_doomed, plus.prefill_budget) == (True, PLUS_PREFILL_BUDGET)
    assert (plus.chunked, plus.laxity, plus.least_loaded) == (True, True, True)
    plain = _toggle("tropical+", demote_doomed=False, prefill_batch_tokens=4096)
    assert (plain.demote_doomed, plain.prefill_budget) == (False, 4096)


def test_tropical_plus_spares_finishing_prompts_by_default_and_the_papers_toggle_does_not() -> None:
    plus, paper = make_policy("tropical+"), make_policy("tropical")
    assert plus.rules(Role.MULTIPLEX).spare_finishing and not paper.rules(Role.MULTIPLEX).spare_finishing
    assert not make_policy("tropical+", SimConfig(spare_finishing=False).policy_params()).rules(
        Role.MULTIPLEX).spare_finishing
    assert make_policy("tropical", SimConfig(spare_finishing=True).policy_params()).rules(
        Role.MULTIPLEX).spare_finishing
    assert not plus.rules(Role.PREFILL).spare_finishing


def test_tropical_plus_queues_by_deadline_and_size_by_default_and_the_papers_toggle_by_latest_start() -> None:
    for role in (Role.PREFILL, Role.MULTIPLEX):
        assert make_policy("tropical+").rules(role).size_weight == PLUS_SIZE_WEIGHT
        assert make_policy("tropical").rules(role).size_weight == LATEST_START
        deadline_first = make_policy("tropical+", SimConfig(size_weight=0.0).policy_params())
        assert deadline_first.rules(role).size_weight == 0.0


@pytest.mark.parametrize("weight", [-1.5, math.nan, math.inf])
def test_a_size_weight_below_latest_start_or_not_a_number_is_named(weight: float) -> None:
    with pytest.raises(ValueError, match="size_weight must be a number of at least -1"):
        SimConfig(size_weight=weight).policy_params()
    with pytest.raises(ValueError, match="size_weight must be a number of at least -1"):
        BatchRules(laxity=True, size_weight=weight)


def test_the_papers_toggle_keeps_its_own_defaults() -> None:
    paper = _toggle("tropical")
    assert (paper.demote_doomed, paper.prefill_budget, paper.chunked) == (False, None, False)
    assert _toggle("tropical", demote_doomed=True).demote_doomed is True


def test_each_pool_of_tropical_plus_gets_its_defaults() -> None:
    pooled = make_policy("tropical+/2pools")
    assert isinstance(pooled, PooledPolicy)
    assert [p.toggle.prefill_budget for p in pooled.pools if isinstance(p, TropicalPolicy)] == [
        PLUS_PREFILL_BUDGET] * 2


def test_tropical_plus_cuts_long_prompts_into_pieces_by_default_and_the_papers_toggle_does_not() -> None:
    from tropical.sched.registry import PLUS_PREFILL_PIECE

    assert make_policy("tropical+").rules(Role.PREFILL).piece_tokens == PLUS_PREFILL_PIECE
    assert make_policy("tropical+").rules(Role.MULTIPLEX).piece_tokens == 0
    assert make_policy("tropical").rules(Role.PREFILL).piece_tokens == 0
    whole = make_policy("tropical+", SimConfig(prefill_piece_tokens=0).policy_params())
    assert whole.rules(Role.PREFILL).piece_tokens == 0
    assert make_policy("tropical", SimConfig(prefill_piece_tokens=8192).policy_params()).rules(
        Role.PREFILL).piece_tokens == 8192
    with pytest.raises(ValueError, match="prefill_piece must be 0"):
        SimConfig(prefill_piece_tokens=-1).policy_params()


def test_tropical_plus_offers_arrivals_path_2_shorter_first_and_the_papers_toggle_does_not() -> None:
    assert make_policy("tropical+").toggle.shorter_first and not make_policy("tropical").toggle.shorter_first
    assert not make_policy("tropical+", SimConfig(shorter_first=False).policy_params()).toggle.shorter_first


def test_tropical_plus_caps_multiplexing_iterations_for_the_tightest_ttft_and_tropical_does_not() -> None:
    assert make_policy("tropical+").toggle.iteration_cap and not make_policy("tropical").toggle.iteration_cap
    assert not make_policy("tropical+", SimConfig(iteration_cap=False).policy_params()).toggle.iteration_cap


def test_tropical_plus_prices_path2_beside_the_decodes_its_queued_prompts_become() -> None:
    plus, paper = make_policy("tropical+").toggle, make_policy("tropical").toggle
    assert plus.joining_decodes and not paper.joining_decodes
    off = SimConfig(joining_decodes=False).policy_params()
    assert not make_policy("tropical+", off).toggle.joining_decodes
