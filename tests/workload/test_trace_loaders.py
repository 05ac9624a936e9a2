"""Trace file parsing: each format, gzip, and errors that name the file and line."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tropical.workload.loaders import (
    TraceError,
    load_azure,
    load_csv,
    load_lengths_csv,
    load_mooncake,
)

WriteTrace = Callable[[str, str], Path]


def _jsonl(*records: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _rec(ts: object = 0, inp: object = 600, out: object = 5, ids: object = (0, 1)) -> dict:
    return {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": list(ids)}


AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2023-11-16 23:59:59.9799600,4808,10\r\n"
    "2023-11-16 23:59:59.9999999,3180,8\r\n"
    "2023-11-17 00:00:01.0000001,110,1"
)


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_mooncake_rebases_ms_to_seconds(write_trace: WriteTrace, name: str) -> None:
    text = _jsonl(_rec(2000, 600, 5, [0, 1]), _rec(3500, 7, 1, [0]), _rec(3500, 1, 2, []))
    trace = load_mooncake(write_trace(name, text))
    assert trace.name == "t"
    assert [e.arrival for e in trace.entries] == [0.0, 1.5, 1.5]
    assert [(e.input_len, e.output_len) for e in trace.entries] == [(600, 5), (7, 1), (1, 2)]
    assert [e.prefix_blocks for e in trace.entries] == [(0, 1), (0,), ()]


def test_mooncake_lines_without_hash_ids_reuse_nothing_and_are_counted(write_trace: WriteTrace) -> None:
    bare = {"timestamp": 10, "input_length": 600, "output_length": 5}
    trace = load_mooncake(write_trace("t.jsonl", _jsonl(_rec(0), bare, bare)))
    assert [e.prefix_blocks for e in trace.entries] == [(0, 1), (), ()]
    assert trace.prefix_note.startswith("2 of 3 lines of t have no hash_ids")


def test_mooncake_with_every_hash_ids_has_no_note(write_trace: WriteTrace) -> None:
    assert load_mooncake(write_trace("t.jsonl", _jsonl(_rec(0), _rec(1)))).prefix_note == ""


def test_mooncake_skips_blank_lines_and_accepts_crlf(write_trace: WriteTrace) -> None:
    text = "\n" + _jsonl(_rec(0)).replace("\n", "\r\n") + "\n  \n" + _jsonl(_rec(10))
    assert [e.arrival for e in load_mooncake(write_trace("t.jsonl", text)).entries] == [0, 0.01]


@pytest.mark.parametrize("name", ["a.csv", "a.csv.gz"])
def test_azure_absolute_timestamps_exact_across_midnight(
    write_trace: WriteTrace, name: str
) -> None:
    trace = load_azure(write_trace(name, AZURE))
    assert trace.name == "a"
    arrivals = [e.arrival for e in trace.entries]
    assert arrivals == pytest.approx([0.0, 0.0200399, 1.0200401], abs=1e-12)
    assert [(e.input_len, e.output_len) for e in trace.entries] == [(4808, 10), (3180, 8), (110, 1)]
    assert all(e.prefix_blocks == () for e in trace.entries)


def test_azure_accepts_fewer_fraction_digits_and_lf(write_trace: WriteTrace) -> None:
    rows = [
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-11-16 18:00:00,5,1",
        "2023-11-16 18:00:00.5,5,1",
    ]
    text = "\n".join(rows) + "\n"
    assert [e.arrival for e in load_azure(write_trace("a.csv", text)).entries] == [0.0, 0.5]


@pytest.mark.parametrize(
    "header",
    ["input_len,output_len", "id,output_length,input_length",
     "num_prefill_tokens,num_decode_tokens,pd_ratio"],
)
@pytest.mark.parametrize("name", ["l.csv", "l.csv.gz"])
def test_lengths_csv_columns_by_header(write_trace: WriteTrace, header: str, name: str) -> None:
    inputs, outputs = ["10", "20"], ["1", "2"]
    rows = {"input_len": inputs, "input_length": inputs, "num_prefill_tokens": inputs,
            "output_len": outputs, "output_length": outputs, "num_decode_tokens": outputs,
            "id": ["a", "b"], "pd_ratio": ["10.0", "10.0"]}
    cols = header.split(",")
    text = header + "\n" + "".join(",".join(rows[c][i] for c in cols) + "\n" for i in range(2))
    trace = load_lengths_csv(write_trace(name, text))
    assert [(e.input_len, e.output_len) for e in trace.entries] == [(10, 1), (20, 2)]
    assert not trace.timed and [e.arrival for e in trace.entries] == [0.0, 0.0]


def test_vidur_csv_with_arrived_at_is_timed_in_seconds(write_trace: WriteTrace) -> None:
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n4.314579,396,109\n4.5,879,55\n"
    trace = load_csv(write_trace("splitwise_conv.csv", text))
    assert trace.timed and trace.name == "splitwise_conv"
    assert [e.arrival for e in trace.entries] == [0.0, 4.314579, 4.5]
    assert [(e.input_len, e.output_len) for e in trace.entries] == [(374, 44), (396, 109), (879, 55)]


@pytest.mark.parametrize(("stamps", "what"), [("0,x", "arrived_at must be a finite number"),
                                              ("0,nan", "arrived_at must be a finite number"),
                                              ("5,4", "timestamp goes backwards")])
def test_vidur_csv_bad_arrivals_name_the_line(write_trace: WriteTrace, stamps: str, what: str) -> None:
    first, second = stamps.split(",")
    header = "arrived_at,num_prefill_tokens,num_decode_tokens"
    path = write_trace("v.csv", f"{header}\n{first},1,1\n{second},1,1\n")
    with pytest.raises(TraceError, match=rf"^{path}:3: {what}"):
        load_csv(path)


def test_load_csv_picks_format_by_header(write_trace: WriteTrace) -> None:
    assert load_csv(write_trace("a.csv", AZURE)).timed
    lengths = load_csv(write_trace("l.csv", "input_len,output_len\n10,1\n"))
    assert lengths.entries[0].input_len == 10 and not lengths.timed


GOOD = _jsonl(_rec(0), _rec(5))


@pytest.mark.parametrize(
    ("bad_line", "what"),
    [
        ('{"timestamp": 9, "input_length": 5,', "bad JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps(_rec(ts=9, inp=512, ids=(0, 1))), "2 hash_ids name more 512-token blocks than a"),
        (json.dumps({"input_length": 5, "output_length": 1, "hash_ids": []}), "timestamp"),
        (json.dumps({"timestamp": 9, "output_length": 1, "hash_ids": []}), "input_length"),
        (json.dumps(_rec(inp=0)), "input_length must be an integer >= 1, got 0"),
        (json.dumps(_rec(out=0)), "output_length must be an integer >= 1, got 0"),
        (json.dumps(_rec(out=-3)), "output_length"),
        (json.dumps(_rec(inp=5.5)), "input_length"),
        (json.dumps(_rec(inp="5")), "input_length"),
        (json.dumps(_rec(out=True)), "output_length"),
        (json.dumps(_rec(ts="soon")), "timestamp must be a finite number"),
        ('{"timestamp": NaN, "input_length": 5, "output_length": 1, "hash_ids": []}', "finite"),
        (json.dumps(_rec(ts=4)), "timestamp goes backwards"),
        (json.dumps(_rec(ids=["a"])), "hash_ids must be a list of integers"),
        (json.dumps({**_rec(), "hash_ids": 3}), "hash_ids"),
    ],
)
def test_mooncake_errors_name_file_and_line(
    write_trace: WriteTrace, bad_line: str, what: str
) -> None:
    path = write_trace("bad.jsonl", GOOD + "\n" + bad_line + "\n" + GOOD)  # bad record on line 4
    with pytest.raises(TraceError) as info:
        load_mooncake(path)
    assert str(info.value).startswith(f"{path}:4: ")
    assert what in str(info.value)


AZURE_OK = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,4808,10\r\n"


@pytest.mark.parametrize(
    ("bad_line", "what"),
    [
        ("2023-11-16T18:17:04.1,5", "expected 3 fields"),
        ("2023-11-16 18:17:04.1,5,1,9", "expected 3 fields"),
        ("yesterday,5,1", "bad timestamp"),
        ("2023-13-16 18:17:04.1,5,1", "bad timestamp"),
        ("2023-11-16 18:17:04.1234567890,5,1", "bad timestamp"),
        ("2023-11-16 18:17:02.0,5,1", "timestamp goes backwards"),
        ("2023-11-16 18:17:04.1,five,1", "ContextTokens must be an integer"),
        ("2023-11-16 18:17:04.1,5,0", "GeneratedTokens must be an integer >= 1"),
        ("2023-11-16 18:17:04.1,5,2.5", "GeneratedTokens"),
    ],
)
def test_azure_errors_name_file_and_line(write_trace: WriteTrace, bad_line: str, what: str) -> None:
    path = write_trace("bad.csv.gz", AZURE_OK + bad_line + "\r\n" + AZURE_OK.splitlines()[1])
    with pytest.raises(TraceError) as info:
        load_azure(path)
    assert str(info.value).startswith(f"{path}:3: ")
    assert what in str(info.value)


@pytest.mark.parametrize(
    ("bad_line", "what"),
    [
        ("7", "expected at least 2 fields"),
        ("7,x", "output_len must be an integer"),
        ("-1,3", "input_len must be an integer >= 1"),
    ],
)
def test_lengths_errors_name_file_and_line(
    write_trace: WriteTrace, bad_line: str, what: str
) -> None:
    path = write_trace("bad.csv", f"input_len,output_len\n1,1\n{bad_line}\n")
    with pytest.raises(TraceError) as info:
        load_lengths_csv(path)
    assert str(info.value).startswith(f"{path}:3: ")
    assert what in str(info.value)


@pytest.mark.parametrize(
    ("loader", "header"),
    [(load_azure, "TIMESTAMP,Context,Generated"), (load_lengths_csv, "a,b")],
)
def test_csv_header_errors(
    write_trace: WriteTrace, loader: Callable[[Path], object], header: str
) -> None:
    path = write_trace("h.csv", header + "\n1,2,3\n")
    with pytest.raises(TraceError, match=rf"^{path}:1: expected"):
        loader(path)


@pytest.mark.parametrize(
    ("name", "text", "what"),
    [
        ("e.jsonl", "", "no requests"),
        ("e.jsonl.gz", "\n\n", "no requests"),
        ("e.csv", "", "empty file"),
        ("e.csv.gz", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n", "no requests"),
    ],
)
def test_empty_files_raise(write_trace: WriteTrace, name: str, text: str, what: str) -> None:
    path = write_trace(name, text)
    with pytest.raises(TraceError, match=what):
        load_mooncake(path) if ".jsonl" in name else load_csv(path)


def test_unreadable_files_raise_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        load_mooncake(tmp_path / "missing.jsonl")
    broken = tmp_path / "broken.jsonl.gz"
    for data in (b"not gzip at all", gzip.compress(b'{"timestamp": 0}\n')[:12]):
        broken.write_bytes(data)
        with pytest.raises(TraceError, match="cannot read"):
            load_mooncake(broken)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"input_len,output_len\n\xff\xfe,1\n")
    with pytest.raises(TraceError, match="cannot read"):
        load_lengths_csv(binary)
