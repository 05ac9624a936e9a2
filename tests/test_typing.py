"""The pure layers and the simulator type-check under mypy, as configured in pyproject.toml.

Their hints say what a value may be (a request's first token is None until it comes); a call
that ignores that fails here, at review, rather than as a TypeError deep in a run."""

from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[1]


def test_core_sched_and_sim_type_check(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)   # the configured files are relative to the project's root
    report, errors, status = api.run(["--config-file", str(ROOT / "pyproject.toml"),
                                      "--cache-dir", str(tmp_path)])
    assert status == 0, report + errors
