"""The fidelity report: every line computed from the runs it is given."""

from __future__ import annotations

from dataclasses import replace

from tests.fidelity.test_repeats import run
from tropical.fidelity.repeats import PolicyRepeats, Spread
from tropical.fidelity.report import (
    cell,
    hit_rate_line,
    ranking_lines,
    report,
    rounds_lines,
    speed_line,
    toggle_line,
)


def repeats(policy: str, real_goodputs: list[float], sim_goodput: float) -> PolicyRepeats:
    return PolicyRepeats(policy, tuple(run(policy, 0.5, 0.5, (g, sim_goodput)) for g in real_goodputs))


def test_a_cell_marks_whether_sim_lies_in_the_repeats_spread() -> None:
    spread = Spread(0.5, 0.4, 0.6)
    assert cell(spread, 0.55, 0.1, "ttft_p50_s") == "500 (400..600) / 550 +10% ✓"
    assert cell(spread, 0.7, 0.4, "ttft_p50_s").endswith("✗")


def test_ranking_checks_only_pairs_the_live_spread_separates() -> None:
    policies = [repeats("chunked", [1.0, 1.2], 1.0), repeats("disagg", [0.2, 0.3], 1.5),
                repeats("colocated", [1.1, 1.3], 0.9)]
    order, check = ranking_lines(policies)
    assert order.startswith("Goodput order live (mean of repeats): colocated > chunked > disagg")
    # chunked/colocated overlap; chunked-disagg and colocated-disagg are separated and both reversed
    assert "separated: 2" in check and "orders 0 of them" in check
    assert "chunked vs disagg" in check and "disagg vs colocated" in check


def test_toggle_ratio_against_the_best_baseline_live_and_simulated() -> None:
    policies = [repeats("chunked", [1.0, 1.2], 1.0), repeats("tropical+", [1.5, 1.7], 1.4)]
    line = toggle_line(policies)
    assert "live 1.45x (best baseline chunked;" in line
    assert "tropical+'s lowest repeat above the baseline's highest" in line
    assert "simulated 1.40x" in line
    assert "no toggle ratio" in toggle_line(policies[:1])


def test_toggle_ratio_under_stream_attainment_counts_only_streams_without_long_gaps() -> None:
    fine = run("chunked", 0.5, 0.5, (1.0, 1.0))
    stalled = replace(fine, real=replace(fine.real, stream_attainment=0.5))
    policies = [PolicyRepeats("chunked", (stalled,)), repeats("tropical+", [1.5], 1.4)]
    paper, stream = toggle_line(policies).splitlines()
    assert "tropical+ goodput / best baseline's: live 1.50x" in paper
    assert "tropical+ stream goodput / best baseline's: live 3.00x" in stream and "simulated 1.40x" in stream


def test_the_toggle_ratio_by_round_sets_each_round_beside_the_host_speed_in_it() -> None:
    """Round 2 ran on a slow spell: the toggle's lead shrank there, live and in the twin alike."""
    chunked, toggle = repeats("chunked", [1.0, 0.5], 1.0), repeats("tropical+", [1.8, 0.6], 1.5)
    chunked = replace(chunked, runs=(chunked.runs[0], replace(chunked.runs[1], sim_goodput_rps=0.5,
                                                              profile_ratio=1.3)))
    toggle = replace(toggle, runs=(toggle.runs[0], replace(toggle.runs[1], profile_ratio=1.2)))
    [line] = rounds_lines([chunked, toggle])
    assert line == ("tropical+ goodput / best baseline's by round (each round runs every policy once): "
                    "round 1, host at - the profile: live 1.80x over chunked (stream 1.80x), twin 1.50x "
                    "over chunked; round 2, host at 1.25x the profile: live 1.20x over chunked "
                    "(stream 1.20x), twin 3.00x over chunked.")
    assert line in report([chunked, toggle])
    assert rounds_lines([replace(chunked, runs=chunked.runs[:1]), toggle]) == [], "one round: the line above"
    assert rounds_lines([chunked]) == []


def test_report_shows_itl_and_stalls_beside_the_error_goals() -> None:
    text = report([repeats("chunked", [1.0, 1.2], 1.0)])
    assert ("| policy | ITL p50 (ms) | ITL p99 (ms) | stall > 1 s | stream attainment | "
            "stream goodput (req/s) |") in text
    assert ("| chunked | - (-..-) / - - ✗ | - (-..-) / - - ✗ | 0.0% (0.0%..0.0%) / 0.0% - ✓ | "
            "100.0% (100.0%..100.0%) / 100.0% +0% ✓ | 1.100 (1.000..1.200) / 1.000 -9% ✓ |") in text


def test_report_states_the_median_error_and_path_agreement() -> None:
    text = report([repeats("chunked", [1.0, 1.2], 1.0)])
    assert "over 2 repeats" in text and "Path agreement: 20 of 20 requests (100.0%)" in text
    assert "Median absolute error over the 5 latency and attainment numbers: 0.0%" in text
    assert ("Repeat spread of P90 TTFT, (max - min) / mean, and in parentheses the twin's spread with "
            "its speed times 0.98/1.02: chunked 0.0% (twin: 0.0%).") in text


def test_report_says_how_fast_the_runs_went_against_the_profile() -> None:
    fast, slow = repeats("chunked", [1.0, 1.2], 1.0), repeats("disagg", [1.0], 1.0)
    ratios = zip(fast.runs, (0.9, 1.1), strict=True)
    fast = replace(fast, runs=tuple(replace(c, profile_ratio=r) for c, r in ratios))
    slow = replace(slow, runs=(replace(slow.runs[0], profile_ratio=2.4),))
    assert speed_line([fast]) == ("Live iterations' compute over the profile's prediction for them: "
                                  "chunked 1.00x (0.90x..1.10x); all within 1/1.25..1.25x.")
    assert speed_line([fast, slow]).endswith(
        "disagg 2.40x (2.40x..2.40x); outside 1/1.25..1.25x for disagg: the load is not that of the "
        "profile's host.")
    assert speed_line([fast, slow]) in report([fast, slow])


def test_report_sets_the_servers_prefix_hit_rate_beside_the_twins() -> None:
    chunked = repeats("chunked", [1.0, 1.2], 1.0)
    chunked = replace(chunked, runs=tuple(replace(c, hit_rate=h) for c, h in zip(chunked.runs, (0.3, 0.4),
                                                                                  strict=True)))
    line = hit_rate_line([chunked, repeats("disagg", [1.0], 1.0)])
    # The twins served requests without prefixes: they predict no hit.
    assert line == ("Prefix cache hits, share of prompt tokens, live (the server's cached_tokens) / twin: "
                    "chunked 35.0% (30.0%..40.0%) / 0.0% (-35.0 pp); disagg - (-..-) / 0.0% (-).")
    assert hit_rate_line([chunked]) in report([chunked])
    assert chunked.as_dict()["prefix_hit_rate"] == {"real": {"mean": 0.35, "min": 0.3, "max": 0.4},
                                                    "sim": 0.0}
