"""`tropical serve` takes every policy knob `tropical sim` takes, by the same flag, into the policy."""

from __future__ import annotations

from dataclasses import fields

import pytest

from tests.factories import linear_model
from tropical.cli import build_parser, serve_options
from tropical.config import PolicyConfig, SimConfig, slo_spec
from tropical.sched.rules import Role
from tropical.sched.slack import SlackRule
from tropical.serve.options import ServeOptions, policy_and_roles


def _options(*argv: str) -> ServeOptions:
    return serve_options(build_parser().parse_args(["serve", "--model", "tiny-random", *argv]))


def test_serve_and_sim_share_every_policy_knob():
    shared = {f.name for f in fields(PolicyConfig)}
    assert shared <= {f.name for f in fields(ServeOptions)} and shared <= {f.name for f in fields(SimConfig)}
    serve_help = build_parser().parse_args(["serve"])
    assert all(hasattr(serve_help, name) for name in shared)


def test_chunk_budget_and_max_seqs_reach_the_chunked_workers():
    options = _options("--policy", "chunked", "--chunk-budget", "8", "--max-seqs", "3")
    policy, roles = policy_and_roles(options)
    rules = policy.rules(roles[0])
    assert rules.chunked and rules.token_budget == 8 and rules.max_seqs == 3


def test_toggle_knobs_reach_the_tropical_policy():
    options = _options("--policy", "tropical", "--watermark", "0.5", "--slack", "banked",
                       "--lookahead", "4", "--demote-doomed", "true", "--workers", "3",
                       "--prefill-workers", "2")
    policy, roles = policy_and_roles(options)
    assert (policy.toggle.watermark, policy.toggle.slack, policy.toggle.lookahead,
            policy.toggle.demote_doomed) == (0.5, SlackRule.BANKED, 4, True)
    assert roles.count(Role.PREFILL) == 2


def test_unset_flags_keep_the_servers_defaults():
    assert _options() == ServeOptions(model="tiny-random")


@pytest.mark.parametrize(("argv", "message"), [
    (["--slack", "later"], "unknown slack rule"),
    (["--policy", "fastest"], "unknown policy"),
    (["--chunk-budget", "0"], "--chunk-budget must be at least 1"),
    (["--watermark", "1.5"], "watermark must lie in [0, 1]"),
    (["--admission", "reject"], "unknown admission mode 'reject'"),
    (["--admission", "early-reject", "--engine", "vllm"], "--admission refuses requests"),
])
def test_bad_policy_flags_are_clear_errors(argv: list[str], message: str):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _options(*argv)


def test_the_servers_default_slo_carries_the_configured_tbt_scale():
    spec = slo_spec(_options("--slo-scale", "3", "--tbt-scale", "2", "--slo-tpot-ms", "80"))
    assert (spec.ttft_scale, spec.tpot_scale, spec.tbt_scale, spec.tpot_ms) == (3.0, 3.0, 2.0, 80.0)
    assert spec.resolve(100, linear_model()).tbt == 2 * 0.080


def test_sim_and_serve_build_the_same_default_slo_from_the_same_settings():
    sim = SimConfig(ttft_scale=4.0, tpot_scale=4.0, tbt_scale=6.0, slo_ttft_ms=900.0)
    serve = ServeOptions(slo_scale=4.0, tbt_scale=6.0, slo_ttft_ms=900.0)
    assert slo_spec(sim) == slo_spec(serve)
