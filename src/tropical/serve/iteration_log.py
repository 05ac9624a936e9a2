"""Every iteration the server ran, one JSON line each (``tropical serve --iteration-log FILE``).

The /metrics counters sum iteration times over a run, which hides how the engine's real speed
depends on the batch: a profile can be right on average and still price small decodes at twice
their time and prefills too cheap. The log keeps each iteration's shape and times, so a fidelity
study can price its twin by the iterations the server really ran (``fidelity.overheads``).
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


class IterationLog:
    """Appends records to a file, a line each, flushed per line so a reader after the server
    stops (or a killed server) sees every iteration that finished."""

    def __init__(self, path: str | Path) -> None:
        self._file: TextIO = Path(path).open("w", buffering=1)  # noqa: SIM115 - open for the server's life

    def write(self, record: IterationRecord) -> None:
        self._file.write(record.as_json() + "\n")

    def close(self) -> None:
        self._file.close()


def read_iterations(path: str | Path) -> list[IterationRecord]:
    """The records of an iteration log, gzipped or not (``.gz``: published studies keep theirs
    small); a line that is not a record names its line number."""
    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            records.append(IterationRecord.from_json(line))
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"{path}:{number}: not an iteration record ({err})") from None
    return records
