"""The server's iteration log: every iteration's worker, start, shape and times, readable back."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.serve.fake_cluster import at, finished, run_virtual, start_router, submission
from tests.serve.test_router import build, migrate_to_a_busy_decoder, requests
from tropical.core.latency.shape import BatchShape
from tropical.serve.iteration_log import IterationLog, IterationRecord, read_iterations, read_migrations


def test_records_read_back_as_written(tmp_path: Path) -> None:
    record = IterationRecord(1, 12.5, BatchShape.prefill(64, 16).plus_prefill(8, 0), 0.25, 0.2, 0.18)
    log = IterationLog(tmp_path / "it.jsonl")
    log.write(record)
    log.close()
    assert read_iterations(tmp_path / "it.jsonl") == [record]
    (tmp_path / "it.jsonl.gz").write_bytes(gzip.compress((tmp_path / "it.jsonl").read_bytes()))
    assert read_iterations(tmp_path / "it.jsonl.gz") == [record]


def test_a_broken_line_is_named_by_its_number(tmp_path: Path) -> None:
    path = tmp_path / "it.jsonl"
    good = IterationRecord(0, 0.0, BatchShape.decode(2, 100), 0.1, 0.09, 0.08).as_json()
    path.write_text(f"{good}\n{{\"worker\": 0}}\n")
    with pytest.raises(ValueError, match=r"it.jsonl:2: not an iteration or migration record"):
        read_iterations(path)


def test_the_router_logs_every_iteration_it_runs(tmp_path: Path) -> None:
    reqs = requests((50, 6), (30, 4))

    async def main(loop):
        policy, workers = build("colocated", workers=2)
        fake = start_router(loop, policy, workers, {0: 50, 1: 30})
        fake.router.iteration_log = IterationLog(tmp_path / "it.jsonl")
        handles = [fake.router.submit(submission(r)) for r in reqs]
        for h in handles:
            await finished(h)
        await at(loop, loop.time() + 1.0)
        await fake.router.stop()
        fake.router.iteration_log.close()
        return fake

    fake = run_virtual(main)
    records = read_iterations(tmp_path / "it.jsonl")
    logged = sorted((r.worker, r.start, r.shape.tokens) for r in records)
    assert logged == sorted((w, t, b.shape.tokens) for w, t, b in fake.plans), "one record per planned batch"
    # The fake workers take exactly the profile's time, on a virtual clock with no overhead.
    assert all(r.compute > 0 and r.wall == pytest.approx(r.compute) == r.predicted for r in records)
    assert sum(r.shape.prefill_tokens for r in records) == 80
    assert sum(r.shape.decode_count for r in records) == 8


def test_the_router_logs_each_migrations_export_wait_and_import(tmp_path: Path) -> None:
    """The decode worker is mid-step when the KV is staged: the log splits the move (export plus
    import, the request's migration time) from the wait for that step to end."""
    log = IterationLog(tmp_path / "it.jsonl")
    _, handle = migrate_to_a_busy_decoder(log)
    log.close()
    moves = {m.request: m for m in read_migrations(tmp_path / "it.jsonl")}
    m = moves[handle.req.id]
    assert (m.source, m.target, m.tokens) == (0, 1, 3000)
    assert m.staged <= m.exported < m.landed <= m.imported, "staged mid-step, imported at the boundary"
    assert m.exported - m.staged + m.imported - m.landed == pytest.approx(handle.req.migration_time)
    assert all(isinstance(r, IterationRecord) for r in read_iterations(tmp_path / "it.jsonl"))
