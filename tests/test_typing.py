"""The package type-checks under mypy, as configured in pyproject.toml.

Their hints say what a value may be (a request's first token is None until it comes); a call
that ignores that fails here, at review, rather than as a TypeError deep in a run."""

from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_type_checks(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)   # the configured files are relative to the project's root
    report, errors, status = api.run(["--config-file", str(ROOT / "pyproject.toml"),
                                      "--cache-dir", str(tmp_path)])
    assert status == 0, report + errors
