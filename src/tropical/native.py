"""The simulator compiled with mypyc: built on request, run only while it matches the sources.

``tropical native build`` copies the package into a folder named by a hash of every file in
it (and of the interpreter's ABI), and compiles there the pure layers and the simulator's loop
(``COMPILED``, every module of it). When ``tropical`` is imported and a build for exactly its
files exists, the package's submodules load from that build; an edited source names another
folder, so a stale build is never run. ``TROPICAL_NATIVE=0`` runs the plain sources whatever
is built. Compiled and plain runs decide identically (``tests/test_native.py``).
"""

from __future__ import annotations

import copyreg
import dataclasses
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent
COMPILED = ("core", "sched", "sim/simulator.py", "sim/decode_run.py", "sim/event.py",
            "sim/cluster.py")
"""What a simulation runs once the trace is loaded, relative to the package."""


class BuildError(RuntimeError):
    """mypyc is missing or refused the sources; the plain sources still run."""


@dataclass(frozen=True)
class NativeStatus:
    """Where the build for these sources lives, whether it exists, and whether it runs here."""

    folder: Path
    built: bool
    running: bool

    def describe(self) -> str:
        state = "built" if self.built else "not built (run `tropical native build`)"
        runs = "this process runs it" if self.running else "this process runs the plain sources"
        return f"native build for these sources: {state}, at {self.folder}; {runs}"


def modules(package: Path = PACKAGE) -> list[str]:
    """The files to compile, relative to ``package``."""
    files: list[str] = []
    for entry in COMPILED:
        path = package / entry
        found = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        files += [p.relative_to(package).as_posix() for p in found]
    return files


def source_key(package: Path = PACKAGE) -> str:
    """A hash of every file of ``package`` (bytecode and builds aside), the interpreter's ABI
    and the list of compiled modules: two trees share a build only when all of them agree."""
    digest = hashlib.sha256(f"{sys.implementation.cache_tag}|{sorted(modules(package))}".encode())
    for path in sorted(p for p in package.rglob("*") if p.is_file() and not _ignored(p)):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def _ignored(path: Path) -> bool:
    """Not a source: bytecode, and what a build leaves beside the sources."""
    return "__pycache__" in path.parts or path.suffix in (".so", ".pyc")


def builds_dir() -> Path:
    """Where builds are kept: ``TROPICAL_NATIVE_DIR``, else beside the environment's packages."""
    return Path(os.environ.get("TROPICAL_NATIVE_DIR") or Path(sys.prefix) / "tropical-native")


def running() -> bool:
    """Does this process run the compiled build (the package's submodules load from elsewhere
    than its sources)?"""
    return Path(next(iter(sys.modules["tropical"].__path__))).resolve() != PACKAGE


def status(package: Path = PACKAGE) -> NativeStatus:
    folder = builds_dir() / source_key(package)
    return NativeStatus(folder, (folder / "tropical").is_dir(), running())


def build(package: Path = PACKAGE) -> Path:
    """Compile the build for ``package``'s files unless it exists; returns its folder. Builds
    of other sources in the same place are removed (they can never run again)."""
    root = builds_dir()
    folder = root / source_key(package)
    if (folder / "tropical").is_dir():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".building-") as scratch:
        tree = Path(scratch) / "tree"
        shutil.copytree(package, tree / "tropical",
                        ignore=lambda folder, names: [n for n in names if _ignored(Path(folder, n))])
        compiled = [f"tropical/{m}" for m in modules(package)]
        done = subprocess.run([sys.executable, "-m", "mypyc", *compiled], cwd=tree,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"mypyc could not compile the simulator:\n{done.stdout[-4000:]}"
                               f"{done.stderr[-4000:]}")
        shutil.rmtree(tree / "build", ignore_errors=True)
        for old in root.iterdir():
            if old.is_dir() and not old.name.startswith("."):
                shutil.rmtree(old, ignore_errors=True)
        tree.rename(folder)
    return folder


def activate(package_path: list[str]) -> bool:
    """Load the package's submodules from the build for these sources, if there is one and
    ``TROPICAL_NATIVE`` is not 0; True when they will. Call from the package's ``__init__``."""
    if os.environ.get("TROPICAL_NATIVE", "") == "0":
        return False
    folder = builds_dir() / source_key()
    if not (folder / "tropical").is_dir():
        return False
    plain = list(package_path)
    package_path[:] = [str(folder / "tropical")]
    if str(folder) not in sys.path:
        sys.path.append(str(folder))  # mypyc's shared library; the package itself stays first
    try:
        for name in modules():
            _picklable(importlib.import_module(_module_name(name)))
    except ImportError as err:
        _fall_back(package_path, plain)
        print(f"tropical: the compiled build in {folder} does not load ({err}); running the plain "
              f"sources (delete that folder and run `tropical native build` again)", file=sys.stderr)
        return False
    return True


def _fall_back(package_path: list[str], plain: list[str]) -> None:
    """Load the package's submodules from ``plain`` again, forgetting any the build loaded."""
    package_path[:] = plain
    for name in [m for m in sys.modules if m.startswith("tropical.") and m != __name__]:
        del sys.modules[name]


def _module_name(path: str) -> str:
    """``sched/worker.py`` → ``tropical.sched.worker``; a package's ``__init__`` is the package."""
    parts = ["tropical", *path.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _picklable(module: Any) -> None:
    """Compiled dataclasses cross processes (a sweep's, Ray's), but pickle's restore cannot
    set the attributes of frozen ones: register a reducer that sets every native attribute
    directly. (Compiled classes whose constructor is written, not generated, run it in their
    ``__new__``: those that cross processes define ``__reduce__``, and keep it.)"""
    for value in vars(module).values():
        if (isinstance(value, type) and value.__module__ == module.__name__
                and hasattr(value, "__mypyc_attrs__") and dataclasses.is_dataclass(value)
                and "__reduce__" not in vars(value)):
            copyreg.pickle(value, _reduce)


def _reduce(obj: Any) -> tuple[Any, tuple[type, dict[str, Any]]]:
    names = {name for cls in type(obj).__mro__ for name in getattr(cls, "__mypyc_attrs__", ())}
    state = {name: getattr(obj, name) for name in names - {"__dict__"} if hasattr(obj, name)}
    return _restore, (type(obj), {**state, **getattr(obj, "__dict__", {})})


def _restore(cls: Any, state: dict[str, Any]) -> Any:
    obj = cls.__new__(cls)
    for name, value in state.items():
        object.__setattr__(obj, name, value)
    return obj
