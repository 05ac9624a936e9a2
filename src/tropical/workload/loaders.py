"""Parse trace files (Mooncake JSONL, Azure CSV, length CSVs as Vidur writes them) into Traces, strictly.

A bad record raises TraceError naming the file and 1-based line, so a broken trace fails
loudly at load time instead of skewing a simulation. Plain and ``.gz`` files are accepted;
blank lines are skipped.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TextIO, TypeVar

from tropical.workload.trace import PREFIX_BLOCK_TOKENS, Trace, TraceEntry

PathLike = str | os.PathLike[str]
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_INPUT_COLUMNS = ("input_len", "input_length", "num_prefill_tokens")
_OUTPUT_COLUMNS = ("output_len", "output_length", "num_decode_tokens")
TIME_COLUMN = "arrived_at"  # Vidur's and Sarathi-Serve's arrival column, in seconds
_AZURE_TIME = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?")
_INT_TYPE = frozenset({int})  # bool is a subclass of int, so compare exact types
_EPOCH = datetime(1970, 1, 1)
_SECOND = timedelta(seconds=1)

_R = TypeVar("_R")
# (timestamp in the file's unit, input_len, output_len, prefix_blocks)
_Row = tuple[float, int, int, tuple[int, ...]]


class TraceError(ValueError):
    """A trace file that cannot be read or holds a malformed record."""


class _LineError(Exception):
    """What is wrong with one record; the caller adds the file and line."""


def load_mooncake(path: PathLike) -> Trace:
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``
    (a line without ``hash_ids`` reuses no prefix; the trace's ``prefix_note`` counts them)."""
    with _open_text(path) as f:
        trace = _timed_trace(path, _parsed(path, _lines(f), _mooncake_row), units_per_second=1000)
    bare = sum(not e.prefix_blocks for e in trace.entries)
    if bare:
        note = (f"{bare} of {len(trace)} lines of {trace.name} have no hash_ids: their prompts "
                "reuse no cached prefix")
        return replace(trace, prefix_note=note)
    return trace


def load_azure(path: PathLike) -> Trace:
    """Azure LLM inference CSV; absolute timestamps become seconds from the first request."""
    with _open_text(path) as f:
        lines = _lines(f)
        header = _header(path, lines)
        if header != AZURE_HEADER:
            raise TraceError(f"{path}:1: expected header {','.join(AZURE_HEADER)}, got {header}")
        return _timed_trace(path, _parsed(path, lines, _azure_row), units_per_second=10**9)


def load_lengths_csv(path: PathLike) -> Trace:
    """CSV of prompt/output lengths (ours, or Vidur's and Sarathi-Serve's ``num_prefill_tokens``,
    ``num_decode_tokens``); timed by an ``arrived_at`` column in seconds when there is one, else
    untimed (arrivals come from a request rate later)."""
    with _open_text(path) as f:
        lines = _lines(f)
        header = _header(path, lines)
        rows = list(_parsed(path, lines, _lengths_parser(path, header)))
    if TIME_COLUMN in header:
        return _timed_trace(path, rows, units_per_second=1)
    if not rows:
        raise TraceError(f"{path}: no requests")
    entries = (TraceEntry(0.0, i, o) for _, (_, i, o, _) in rows)
    return Trace(trace_name(path), tuple(entries), timed=False)


def load_csv(path: PathLike) -> Trace:
    """A CSV trace: Azure's if its header says so, else lengths (maybe with ``arrived_at``)."""
    if read_csv_header(path) == AZURE_HEADER:
        return load_azure(path)
    return load_lengths_csv(path)


def read_csv_header(path: PathLike) -> tuple[str, ...]:
    """The first line of a CSV file as stripped fields."""
    with _open_text(path) as f:
        return _header(path, _lines(f))


def trace_name(path: PathLike) -> str:
    """A file's name without directory and ``.gz``/format suffixes (``conversation_trace``)."""
    name = Path(path).name
    name = name.removesuffix(".gz")
    return name.rsplit(".", 1)[0] if "." in name else name


@contextmanager
def _open_text(path: PathLike) -> Iterator[TextIO]:
    """Open plain or gzipped text; read failures become TraceError naming the file."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            yield f
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read: {e}") from None


def _lines(f: TextIO) -> Iterator[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers."""
    return ((n, line) for n, line in enumerate(f, 1) if not line.isspace())


def _parsed(
    path: PathLike, lines: Iterable[tuple[int, str]], parse: Callable[[str], _R]
) -> Iterator[tuple[int, _R]]:
    """Parse numbered records, turning a record's error into a TraceError at its line."""
    for lineno, raw in lines:
        try:
            row = parse(raw)
        except _LineError as e:
            raise TraceError(f"{path}:{lineno}: {e}") from None
        yield lineno, row


def _timed_trace(path: PathLike, rows: Iterable[tuple[int, _Row]], units_per_second: int) -> Trace:
    """Entries with arrivals re-based to the first timestamp; timestamps must not go backwards."""
    entries = []
    first: float | None = None
    previous = -math.inf
    for lineno, (stamp, input_len, output_len, blocks) in rows:
        if stamp < previous:
            raise TraceError(f"{path}:{lineno}: timestamp goes backwards ({stamp} < {previous})")
        first = stamp if first is None else first
        previous = stamp
        arrival = (stamp - first) / units_per_second
        entries.append(TraceEntry(arrival, input_len, output_len, blocks))
    if not entries:
        raise TraceError(f"{path}: no requests")
    return Trace(trace_name(path), tuple(entries))


def _mooncake_row(line: str) -> _Row:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise _LineError(f"bad JSON at column {e.colno}: {e.msg}") from None
    if type(record) is not dict:
        raise _LineError("expected a JSON object")
    try:
        stamp, blocks = record["timestamp"], record.get("hash_ids", [])
        input_len, output_len = record["input_length"], record["output_length"]
    except KeyError as e:
        raise _LineError(f"missing key {e}") from None
    if type(stamp) not in (int, float) or not math.isfinite(stamp):
        raise _LineError(f"timestamp must be a finite number, got {stamp!r}")
    if type(blocks) is not list or not set(map(type, blocks)) <= _INT_TYPE:
        raise _LineError(f"hash_ids must be a list of integers, got {blocks!r}")
    prompt = _length(input_len, "input_length")
    if len(blocks) > -(-prompt // PREFIX_BLOCK_TOKENS):
        raise _LineError(f"{len(blocks)} hash_ids name more {PREFIX_BLOCK_TOKENS}-token blocks than "
                         f"a prompt of {prompt} tokens holds")
    return stamp, prompt, _length(output_len, "output_length"), tuple(blocks)


def _azure_row(line: str) -> _Row:
    fields = line.split(",")
    if len(fields) != 3:
        raise _LineError(f"expected 3 fields, got {len(fields)}")
    stamp, context, generated = fields
    return (
        _azure_ns(stamp),
        _int_field(context, "ContextTokens"),
        _int_field(generated, "GeneratedTokens"),
        (),
    )


def _azure_ns(text: str) -> int:
    """``2023-11-16 18:17:03.9799600`` as integer ns since 1970, exact to the last digit."""
    bad = _LineError(f"bad timestamp {text!r} (want YYYY-MM-DD HH:MM:SS[.fraction])")
    match = _AZURE_TIME.fullmatch(text.strip())
    if not match:
        raise bad
    try:
        whole = datetime.fromisoformat(match.group(1))
    except ValueError:
        raise bad from None
    fraction = (match.group(2) or "").ljust(9, "0")
    return (whole - _EPOCH) // _SECOND * 10**9 + int(fraction)


def _lengths_parser(path: PathLike, header: tuple[str, ...]) -> Callable[[str], _Row]:
    """A row parser reading the length columns (and ``arrived_at``, if any) named in ``header``."""
    try:
        columns = (_column(header, _INPUT_COLUMNS), _column(header, _OUTPUT_COLUMNS))
    except LookupError:
        raise TraceError(
            f"{path}:1: expected columns input_len,output_len, input_length,output_length or"
            f" num_prefill_tokens,num_decode_tokens (or Azure's {','.join(AZURE_HEADER)}), got {header}"
        ) from None
    time = header.index(TIME_COLUMN) if TIME_COLUMN in header else None
    return partial(_lengths_row, columns, (header[columns[0]], header[columns[1]]), time)


def _column(header: tuple[str, ...], names: tuple[str, ...]) -> int:
    """Index of the first of ``names`` present in ``header``."""
    for name in names:
        if name in header:
            return header.index(name)
    raise LookupError(names)


def _lengths_row(columns: tuple[int, int], names: tuple[str, str], time: int | None, line: str) -> _Row:
    fields = line.split(",")
    needed = max(*columns, -1 if time is None else time) + 1
    if len(fields) < needed:
        raise _LineError(f"expected at least {needed} fields, got {len(fields)}")
    stamp = 0.0 if time is None else _seconds(fields[time])
    return stamp, _int_field(fields[columns[0]], names[0]), _int_field(fields[columns[1]], names[1]), ()


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise _LineError(f"{TIME_COLUMN} must be a finite number of seconds, got {text.strip()!r}")
    return value


def _header(path: PathLike, lines: Iterator[tuple[int, str]]) -> tuple[str, ...]:
    """The first non-blank line's comma-separated fields, stripped."""
    first = next(lines, None)
    if first is None:
        raise TraceError(f"{path}: empty file")
    return tuple(field.strip() for field in first[1].split(","))


def _int_field(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _LineError(f"{name} must be an integer, got {text!r}") from None
    return _length(value, name)


def _length(value: object, name: str) -> int:
    """A token count: an integer >= 1 (a request has a prompt and produces a token)."""
    if type(value) is not int or value < 1:
        raise _LineError(f"{name} must be an integer >= 1, got {value!r}")
    return value
