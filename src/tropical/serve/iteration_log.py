"""Every iteration the server ran, one JSON line each (``tropical serve --iteration-log FILE``).

The /metrics counters sum iteration times over a run, which hides how the engine's real speed
depends on the batch: a profile can be right on average and still price small decodes at twice
their time and prefills too cheap. The log keeps each iteration's shape and times, so a fidelity
study can price its twin by the iterations the server really ran (``fidelity.overheads``).
It also keeps each KV migration's phases (a line under ``"migration"``), so the time a stream
waits between its first and second token can be split into export, wait and import.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from tropical.core.latency.shape import BatchShape


@dataclass(frozen=True, slots=True)
class IterationRecord:
    """One iteration: its worker, when it was planned (router clock, seconds), its shape, the
    router's wall time for it, the worker's compute time, and the profile's prediction."""

    worker: int
    start: float
    shape: BatchShape
    wall: float
    compute: float
    predicted: float

    def as_json(self) -> str:
        return json.dumps({**asdict(self), "shape": asdict(self.shape)})

    @classmethod
    def from_json(cls, line: str) -> IterationRecord:
        data = json.loads(line)
        return cls(**{**data, "shape": BatchShape(**data["shape"])})


@dataclass(frozen=True, slots=True)
class MigrationRecord:
    """One KV migration on the router's clock: when its export began (``staged``) and ended, when
    the target's driver began importing it at its boundary (``landed``), and when that ended."""

    request: int
    source: int
    target: int
    tokens: int
    staged: float
    exported: float
    landed: float
    imported: float

    def as_json(self) -> str:
        return json.dumps({"migration": asdict(self)})


class IterationLog:
    """Appends records to a file, a line each, flushed per line so a reader after the server
    stops (or a killed server) sees every iteration that finished."""

    def __init__(self, path: str | Path) -> None:
        self._file: TextIO = Path(path).open("w", buffering=1)  # noqa: SIM115 - open for the server's life

    def write(self, record: IterationRecord | MigrationRecord) -> None:
        self._file.write(record.as_json() + "\n")

    def close(self) -> None:
        self._file.close()


def read_iterations(path: str | Path) -> list[IterationRecord]:
    """The iteration records of a log, gzipped or not (``.gz``: published studies keep theirs
    small); a line that is no record names its line number."""
    return [r for r in _records(path) if isinstance(r, IterationRecord)]


def read_migrations(path: str | Path) -> list[MigrationRecord]:
    """The migration records of a log (none in logs written before they were kept)."""
    return [r for r in _records(path) if isinstance(r, MigrationRecord)]


def _records(path: str | Path) -> list[IterationRecord | MigrationRecord]:
    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    records: list[IterationRecord | MigrationRecord] = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            data = json.loads(line)
            records.append(MigrationRecord(**data["migration"]) if "migration" in data
                           else IterationRecord.from_json(line))
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"{path}:{number}: not an iteration or migration record ({err})") from None
    return records
