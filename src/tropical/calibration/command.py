"""`tropical calibrate`: fit every GPU found in Vidur's profiles, write the JSON, print errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tropical.calibration.fit import ITERATION_OVERHEAD_S, calibrate
from tropical.calibration.report import format_table, op_errors
from tropical.calibration.store import CALIBRATION_DIR, save_calibration
from tropical.calibration.vidur import load_profiles
from tropical.core.latency.roofline import Efficiency

SOURCE = ("microsoft/vidur@7d47513 profiling data (MIT), see "
          "shared/data/profiles/vidur/SOURCE.md")
COMMAND = "tropical calibrate --vidur ../shared/data/profiles/vidur"
DONOR_GPU = "a100-80gb"


def _assumptions(has_attention: bool) -> list[str]:
    notes = [f"iteration_overhead = {ITERATION_OVERHEAD_S * 1e3:g} ms per iteration (CPU "
             "scheduling, input preparation, sampling) is assumed, not measured",
             "prefill_attention.compute and prefill_tile_waste are fitted on the FlashInfer "
             "rows only; its overhead and memory come from decode attention"]
    if not has_attention:
        notes.append(f"attention factors borrowed from {DONOR_GPU} (no attention profile)")
    return notes


def calibrate_main(vidur_dir: Path, out_dir: Path | None, report: bool) -> dict[str, Any]:
    """Fit, write ``<out_dir>/<gpu>.json`` per GPU, print the error table if ``report``.

    ``out_dir`` None means the package's shipped files. Returns {gpu name: the written
    document}. GPUs without attention rows borrow the A100's attention factors, so it goes first.
    """
    profiles = load_profiles(vidur_dir)
    order = sorted(profiles, key=lambda name: name != DONOR_GPU)
    documents: dict[str, Any] = {}
    donor: Efficiency | None = None
    for name in order:
        eff = calibrate(profiles[name], donor)
        donor = donor or eff
        errors = op_errors(eff, profiles[name])
        documents[name] = {
            "gpu": name, "source": SOURCE, "command": COMMAND,
            "assumptions": _assumptions(bool(profiles[name].attention)),
            "efficiency": eff.to_dict(), "errors": [e.to_dict() for e in errors]}
        save_calibration(documents[name], out_dir or CALIBRATION_DIR)
        if report:
            print(format_table(errors), end="\n\n")
    return documents
