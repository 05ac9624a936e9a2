"""`tropical sim` and `tropical --help` load no plotting library: start-up stays quick for the
commands that draw nothing (checked in a fresh interpreter, where other tests' imports cannot
hide a regression)."""

from __future__ import annotations

import subprocess
import sys

import pytest

LOADED = ("import sys, contextlib, io; from tropical.cli import main\n"
          "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
          "    main({argv})\n"
          "print('matplotlib' in sys.modules)")


@pytest.mark.parametrize("argv", [["--help"], ["sim", "--limit", "20"]])
def test_commands_that_draw_nothing_import_no_plotting_library(argv: list[str]) -> None:
    result = subprocess.run([sys.executable, "-c", LOADED.format(argv=argv)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
