"""Where a worker may run: pins written after its role in ``--workers``, read by the Ray backend.

Syntax: ``ROLE[@PIN]...`` with PIN ``node:ADDRESS`` (the Ray node with that IP) or ``gpu[:N]``
(reserve N GPUs, default 1); e.g. ``prefill@node:10.0.0.5,multiplex@gpu``. Pins become Ray
resource demands (every node offers ``node:<its IP>``), so Ray places and restarts the actors
while Tropical only says what each needs. Local workers all run on this machine, so pins there
are an error rather than a silent no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

NODE_SHARE = 0.001
"""Ray's ``node:<ip>`` resource is 1.0 per node; a sliver of it pins without limiting how many
workers share the node."""


@dataclass(frozen=True, slots=True)
class Placement:
    """A worker's pins: the node address it must run on, the GPUs it must hold."""

    node: str | None = None
    gpus: float = 0.0

    @property
    def pinned(self) -> bool:
        return self.node is not None or self.gpus > 0

    def demand(self, cpus: float, default_gpus: float) -> dict[str, float]:
        """The Ray resources this worker asks for, named as ``ray.nodes()`` reports them."""
        wanted = {"CPU": cpus, "GPU": self.gpus or default_gpus}
        if self.node is not None:
            wanted[f"node:{self.node}"] = NODE_SHARE
        return {name: amount for name, amount in wanted.items() if amount > 0}

    def __str__(self) -> str:
        pins = ([f"node:{self.node}"] if self.node else []) + ([f"gpu:{self.gpus:g}"] if self.gpus else [])
        return "@".join(pins) or "anywhere"


def split_pins(entry: str) -> tuple[str, Placement]:
    """``"prefill@node:10.0.0.5@gpu"`` → ``("prefill", Placement("10.0.0.5", 1.0))``."""
    name, *pins = (part.strip() for part in entry.split("@"))
    node, gpus = None, 0.0
    for pin in pins:
        kind, _, value = pin.partition(":")
        if kind == "node" and value:
            node = value
        elif kind == "gpu":
            gpus = _gpus(value, entry)
        else:
            raise ValueError(f"unknown pin {pin!r} in --workers entry {entry.strip()!r}; "
                             f"use node:ADDRESS or gpu[:N]")
    return name, Placement(node, gpus)


def _gpus(text: str, entry: str) -> float:
    try:
        count = float(text or 1)
    except ValueError:
        count = 0.0
    if count <= 0:
        raise ValueError(f"gpu:{text} in --workers entry {entry.strip()!r} must be a positive number of GPUs")
    return count


def check_fits(worker_id: int, demand: dict[str, float], nodes: list[dict]) -> None:
    """Fail at start-up, naming what is missing, when no live node (``ray.nodes()``) could ever
    host this worker: Ray would keep such an actor pending forever."""
    alive = [n for n in nodes if n.get("Alive")]
    if any(all(n["Resources"].get(k, 0.0) >= v for k, v in demand.items()) for n in alive):
        return
    wanted = ", ".join(f"{k} {v:g}" for k, v in demand.items())
    offered = "; ".join(f"{n['NodeManagerAddress']} ({n['Resources'].get('CPU', 0):g} CPUs, "
                        f"{n['Resources'].get('GPU', 0):g} GPUs)" for n in alive) or "none"
    raise ValueError(f"no node of the Ray cluster can host worker {worker_id}, which needs {wanted}; "
                     f"live nodes: {offered}")
