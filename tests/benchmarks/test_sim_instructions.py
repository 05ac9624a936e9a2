"""The instruction counter runs the build it names, or says it could not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.benchmarks.scripts import load

counter = load("sim_instructions")
SRC = Path(counter.ROOT) / "src"


def test_each_tree_has_a_build_folder_of_its_own(tmp_path: Path) -> None:
    compiled = counter.environment(tmp_path / "src", True)
    plain = counter.environment(tmp_path / "src", False)
    assert compiled["PYTHONPATH"] == plain["PYTHONPATH"] == str(tmp_path / "src")
    assert Path(compiled["TROPICAL_NATIVE_DIR"]).parent == tmp_path
    assert not Path(plain["TROPICAL_NATIVE_DIR"]).exists()


def test_a_run_that_would_count_the_wrong_build_stops() -> None:
    """Asked to count the compiled build where none is (a folder with no build), the run stops
    before simulating and says which sources would have run."""
    done = subprocess.run([sys.executable, "-c", counter.RUN, "colocated", "60", "1.0", "-", "compiled"],
                          env=counter.environment(SRC, False), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "expected the compiled sources to run, not plain" in done.stderr
