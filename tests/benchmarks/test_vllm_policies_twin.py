"""benchmarks/vllm_policies_twin.py: which prompts each vLLM instance holds when a run starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import load

V = load("vllm_policies_twin")


def record(rid: int, sent: float, worker: str, tokens: int = 5, error: str | None = None) -> dict:
    return {"id": rid, "sent_s": sent, "prompt_tokens": 300, "max_tokens": tokens,
            "completion_tokens": None if error else tokens, "prefill_worker": worker, "error": error}


def write_run(out: Path, policy: str, rate: str, repeat: int, records: list[dict]) -> Path:
    run = out / policy / f"rate-{rate}" / f"run-{repeat}"
    run.mkdir(parents=True)
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def ids(warm: list[list]) -> list[list[int]]:
    return [[p.id for p in prompts] for prompts in warm]


def test_a_split_policy_leaves_handed_off_prompts_on_both_instances() -> None:
    assert V.holders("disagg", record(0, 0.0, "0")) == (0, 1)
    assert V.holders("tropical", record(0, 0.0, "0", tokens=1)) == (0,)   # ended at its first token
    assert V.holders("tropical", record(0, 0.0, "1")) == (1,)             # multiplexed: never moved
    assert V.holders("vllm-chunked", record(0, 0.0, "0")) == (0,)


def test_each_run_starts_with_the_prompts_of_the_runs_before_it(tmp_path: Path) -> None:
    """Runs come in vllm_policies.sh's order (repeats, rates, policies), whatever the paths' order."""
    later = write_run(tmp_path, "vllm-chunked", "0.1", 1, [record(5, 0.0, "0")])
    first = write_run(tmp_path, "vllm-chunked", "0.05", 1, [record(2, 1.0, "1"), record(1, 0.0, "0")])
    second = write_run(tmp_path, "disagg", "0.05", 1, [record(3, 0.0, "0"), record(4, 1.0, "0", error="500")])
    next_round = write_run(tmp_path, "vllm-chunked", "0.05", 2, [])
    warm = V.warm_starts([next_round, later, second, first])
    assert ids(warm[first]) == [[], []]
    assert ids(warm[second]) == [[1], [2]]
    assert ids(warm[later]) == [[1, 3], [2, 3]]                    # a failed request cached nothing
    assert ids(warm[next_round]) == [[1, 3, 5], [2, 3]]


def test_the_prefix_cache_setting_is_read_from_vllms_log(tmp_path: Path) -> None:
    (tmp_path / "vllm-0.log").write_text("Initializing a V1 LLM engine ... enable_prefix_caching=False, x")
    assert V.prefix_caching(tmp_path) is False
    (tmp_path / "vllm-0.log").write_text("nothing here")
    with pytest.raises(SystemExit, match="enable_prefix_caching"):
        V.prefix_caching(tmp_path)
