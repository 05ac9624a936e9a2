"""The shipped calibration files: one JSON of efficiency factors per GPU kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tropical.core.latency.fitted import FittedModel
from tropical.core.latency.roofline import Efficiency, RooflineModel
from tropical.core.specs import ReplicaSpec

CALIBRATION_DIR = Path(__file__).resolve().parents[1] / "data" / "calibration"


def calibration_path(gpu_name: str, directory: Path = CALIBRATION_DIR) -> Path:
    return directory / f"{gpu_name}.json"


def calibrated_gpus(directory: Path = CALIBRATION_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.json"))


def save_calibration(document: dict[str, Any], directory: Path) -> Path:
    """Write one GPU's document (see data/calibration/README.md) as ``<gpu>.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = calibration_path(document["gpu"], directory)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def load_efficiency(gpu_name: str, directory: Path = CALIBRATION_DIR) -> Efficiency:
    """The factors calibrated for ``gpu_name``; a clear ValueError if absent or unreadable."""
    path = calibration_path(gpu_name, directory)
    if not path.is_file():
        known = ", ".join(calibrated_gpus(directory)) or "none"
        raise ValueError(f"no latency calibration for GPU {gpu_name!r} (calibrated: {known}); "
                         f"run `tropical calibrate` with profiles of that GPU")
    try:
        return Efficiency.from_dict(json.loads(path.read_text())["efficiency"])
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a valid calibration file ({error})") from None


def load_roofline(replica: ReplicaSpec, directory: Path = CALIBRATION_DIR) -> RooflineModel:
    """The calibrated roofline of a replica, from the shipped factors of its GPU."""
    return RooflineModel(replica, load_efficiency(replica.gpu.name, directory))


def load_profile(path: str | Path) -> FittedModel:
    """A fitted latency profile written by ``tropical profile``."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"cannot read latency profile {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"latency profile {path}: not valid JSON ({err})") from None
    try:
        return FittedModel.from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
