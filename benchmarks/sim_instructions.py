"""Instructions a simulation executes, this tree against another revision, per policy.

Usage: python benchmarks/sim_instructions.py --base REV [--policies tropical,tropical+]
       [--limit 600] [--rate-scale 1.0] [--tpot-scale S] [--compiled] [--json]

Wall time on a shared machine moves by a third between two runs of the same code, which hides
the 5-20% a change to the simulator's hot path buys. Instructions counted under valgrind
(``apt-get install valgrind``) do not move with the neighbours' load; they still moved by up to
3% between two runs of the same code here (object addresses, which set and dict layouts follow,
differ from run to run), so read differences of a few percent as none. Each cell runs the
simulator on the first ``--limit`` requests and on the first 50 of the conversation trace on
the paper cluster, in this tree and in a worktree of ``--base``; the difference between the two
sizes is the simulation's own count (start-up and loading cancel). Slow: valgrind runs Python
about 50x slower, so a cell of 600 requests takes a minute or two. ``--compiled`` counts both
trees' mypyc builds (``tropical native build``), each built into a folder of its own (a build
removes the other builds in its folder) and checked to be the one that runs; a compiled cell of
1,500 requests takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tropical.report.tables import render

ROOT = Path(__file__).resolve().parent.parent
SMALL = 50
ENV = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
"""Fixed string hashes (else counts move by about 1.5%), and every run compiles what it imports
alike (a first run that writes bytecode would count its compilation alone)."""
BASE = Path(tempfile.gettempdir()) / "tropical-sim-instructions-base"
"""Where ``--base`` is checked out: the same path every time, since the paths on ``sys.path`` are
hashed too (a fresh temporary name moved the counts by up to 1%)."""
RUN = """
import sys
from tropical import native
from tropical.config import SimConfig
from tropical.sim.build import experiment
from tropical.sim.run import simulate
policy, limit, rate, tpot = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
if native.running() != (sys.argv[5] == "compiled"):
    sys.exit(f"expected the {sys.argv[5]} sources to run, not {'compiled' if native.running() else 'plain'}")
config = SimConfig(limit=limit) if tpot == "-" else SimConfig(limit=limit, tpot_scale=float(tpot))
simulate(experiment(config.with_preset()).with_policy(policy).at_rate(rate))
"""


def environment(src: Path, compiled: bool) -> dict[str, str]:
    """What a run with ``src`` on the path sees: its own build's folder (next to ``src``) if
    compiled, else none (no build matches, so the plain sources run)."""
    native_dir = src.parent / ".tropical-native" if compiled else src.parent / ".no-native-build"
    return {**ENV, "PYTHONPATH": str(src), "TROPICAL_NATIVE_DIR": str(native_dir)}


def build(src: Path) -> None:
    """Compile ``src``'s build into its own folder (nothing to do if it is there)."""
    subprocess.run([sys.executable, "-c", "from tropical import native; native.build()"],
                   env=environment(src, True), check=True, capture_output=True)


def instructions(src: Path, policy: str, limit: int, rate: float, tpot: str, compiled: bool) -> int:
    """Instructions valgrind counts for one simulation with ``src`` on the path."""
    done = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, "-c", RUN, policy, str(limit), str(rate), tpot,
         "compiled" if compiled else "plain"],
        capture_output=True, text=True, env=environment(src, compiled))
    if done.returncode != 0:
        raise RuntimeError(f"the simulation under valgrind failed:\n{done.stderr[-2000:]}")
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise RuntimeError(f"valgrind printed no instruction count:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def simulated(src: Path, policy: str, args: argparse.Namespace) -> int:
    """The simulation's own instructions: ``--limit`` requests less the first 50."""
    return (instructions(src, policy, args.limit, args.rate_scale, args.tpot_scale, args.compiled)
            - instructions(src, policy, SMALL, args.rate_scale, args.tpot_scale, args.compiled))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="revision to compare against (e.g. HEAD~3)")
    parser.add_argument("--policies", default="tropical,tropical+")
    parser.add_argument("--limit", type=int, default=600)
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--tpot-scale", default="-", help="TPOT SLO scale (default: the preset's)")
    parser.add_argument("--compiled", action="store_true",
                        help="count the mypyc builds of both trees (built here if missing)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.limit <= SMALL:
        parser.error(f"--limit must exceed {SMALL}, the size whose count is subtracted")
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    base = BASE
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base],
                   check=True, capture_output=True)
    try:
        if args.compiled:
            build(base / "src")
            build(ROOT / "src")
        counts = {p: (simulated(base / "src", p, args), simulated(ROOT / "src", p, args))
                  for p in args.policies.split(",")}
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                       check=True, capture_output=True)
    if args.json:
        print(json.dumps({p: {"base": b, "tree": t, "ratio": b / t} for p, (b, t) in counts.items()}))
        return
    rows = [[p, f"{b / 1e6:,.0f}", f"{t / 1e6:,.0f}", f"{b / t:.2f}x"] for p, (b, t) in counts.items()]
    print(render(["policy", f"{args.base} (M instr.)", "this tree (M instr.)", "base / tree"], rows))


if __name__ == "__main__":
    main()
