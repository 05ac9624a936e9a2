"""Built-in traces match their published statistics; paths dispatch on suffix."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tropical.workload.catalog import load_slice, load_trace
from tropical.workload.loaders import TraceError
from tropical.workload.transform import LengthBounds

WriteTrace = Callable[[str, str], Path]


# name, requests, duration s, mean input, mean output, total prefix blocks (SOURCE.md)
@pytest.mark.parametrize(
    ("name", "requests", "duration", "mean_in", "mean_out", "blocks"),
    [
        ("conversation", 12_031, 3537.0, 12_035, 343, 288_500),
        ("synthetic", 3_993, 1022.0, 15_325, 149, 121_877),
        ("azure-code", 8_819, 3435.9, 2_048, 28, 0),
    ],
)
def test_builtin_traces_match_published_stats(
    name: str, requests: int, duration: float, mean_in: int, mean_out: int, blocks: int
) -> None:
    trace = load_trace(name)
    assert trace.name == name
    assert len(trace) == requests
    assert trace.entries[0].arrival == 0.0
    assert trace.duration == pytest.approx(duration, abs=0.05)
    assert round(sum(e.input_len for e in trace.entries) / requests) == mean_in
    assert round(sum(e.output_len for e in trace.entries) / requests) == mean_out
    assert sum(len(e.prefix_blocks) for e in trace.entries) == blocks


def test_builtin_traces_are_cached() -> None:
    assert load_trace("conversation") is load_trace("conversation")


def test_paths_dispatch_on_suffix(write_trace: WriteTrace) -> None:
    line = json.dumps({"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]})
    assert load_trace(str(write_trace("m.jsonl.gz", line))).entries[0].prefix_blocks == (0,)
    azure = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,4808,10"
    assert load_trace(str(write_trace("a.CSV", azure))).entries[0].input_len == 4808
    lengths = str(write_trace("l.csv.gz", "input_length,output_length\n9,1\n9,1\n"))
    assert [e.input_len for e in load_trace(lengths).entries] == [9, 9]
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(str(write_trace("x.parquet", "")))


@pytest.mark.parametrize("name", ["conversaton", "no/such/file.jsonl"])
def test_unknown_name_lists_builtins(name: str) -> None:
    with pytest.raises(TraceError, match=f"^{name}: .*conversation, synthetic, azure-code"):
        load_trace(name)


VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(
    f"{i * 0.5},{40 + i},{i + 1}\n" for i in range(6))


def test_a_length_only_trace_needs_a_rate_and_gets_its_arrivals_from_it(write_trace: WriteTrace) -> None:
    lengths = write_trace("l.csv", "num_prefill_tokens,num_decode_tokens\n" + "9,1\n" * 400)
    with pytest.raises(ValueError, match="no arrival times; give a request rate"):
        load_slice(lengths)
    trace = load_slice(lengths, limit=300, rate=4.0, seed=2)
    assert len(trace) == 300 and trace.mean_rate == pytest.approx(4.0, rel=0.2)
    assert load_slice(lengths, limit=5, rate=4.0, seed=2).entries == trace.entries[:5]


def test_rate_replaces_recorded_arrivals_and_cv_needs_a_rate(write_trace: WriteTrace) -> None:
    vidur = write_trace("v.csv", VIDUR)
    assert [e.arrival for e in load_slice(vidur).entries] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert load_slice(vidur, rate=100.0).duration < 0.5
    with pytest.raises(ValueError, match="--arrival-cv .* give --rate"):
        load_slice(vidur, arrival_cv=2.0)


def test_slice_scales_lengths_then_applies_the_bounds(write_trace: WriteTrace) -> None:
    vidur = write_trace("v.csv", VIDUR)
    trace = load_slice(vidur, length_scale=0.1, bounds=LengthBounds(min_input=5, max_output=1))
    assert [(e.input_len, e.output_len) for e in trace.entries] == [(5, 1)] * 6
