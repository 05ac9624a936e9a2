"""Which workers hold each prefix block: the cluster-wide index a cache-aware router keeps
(Dynamo's KV router keeps one as a radix tree fed by KV events), so that finding the workers a
prompt would hit costs its prefix's length, not a look at every worker's cache. Keys are
``Hashable``, as the prefix cache's are (compiled, they pass through unboxed and boxed anew as
``int``)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from tropical.core.request import Request
from tropical.sched.host_store import HostStore

KEPT_FROM = 32
"""Holders a set must have before ``ids`` keeps its array: a smaller set is read as fast as the
kept array is looked up."""
KEPT_MOST = 256
"""Arrays ``ids`` keeps at most (all are dropped when one more would be kept): a fleet's prompts
share a few first blocks, whose sets are what it is asked for again and again."""


@dataclass(slots=True)
class PrefixDirectory:
    """Prefix key -> the ids of the workers whose caches hold that block now; and the arrays
    ``ids`` made of large sets of holders, by the set's identity, with the set (so that its id
    is not reused while kept), each dropped when its set changes."""

    holders: dict[Hashable, set[int]] = field(default_factory=dict)
    arrays: dict[int, tuple[set[int], np.ndarray]] = field(default_factory=dict)

    def add(self, key: Hashable, worker_id: int) -> None:
        held = self.holders.get(key)
        if held is None:
            self.holders[key] = {worker_id}
        elif worker_id not in held:
            held.add(worker_id)
            if self.arrays:
                self.arrays.pop(id(held), None)

    def remove(self, key: Hashable, worker_id: int) -> None:
        held = self.holders.get(key)
        if held is not None and worker_id in held:
            held.remove(worker_id)
            if self.arrays:
                self.arrays.pop(id(held), None)
            if not held:
                del self.holders[key]

    def ids(self, held: set[int]) -> np.ndarray:
        """The worker ids of ``held`` (a set ``levels`` returned) as an array, in no order. A
        large set's array is kept until the set changes: at 1,024 workers the holders of a
        conversation's first block number hundreds, every prompt's floors read them
        (``NewTokenFloors.vector``), and making the array took 13 µs against under 1 to use it."""
        if len(held) < KEPT_FROM:
            return np.fromiter(held, np.int64, len(held))
        kept = self.arrays.get(id(held))
        if kept is not None and kept[0] is held:
            return kept[1]
        if len(self.arrays) >= KEPT_MOST:
            self.arrays.clear()
        array = np.fromiter(held, np.int64, len(held))
        self.arrays[id(held)] = (held, array)
        return array

    def drop_worker(self, worker_id: int) -> None:
        """``worker_id`` lost its cache (it died, or came back empty)."""
        for key in [k for k, held in self.holders.items() if worker_id in held]:
            self.remove(key, worker_id)

    def runs(self, req: Request) -> dict[int, int]:
        """For each worker holding ``req``'s first prefix block: how many of its blocks, from
        the first, it holds."""
        return {worker_id: depth for depth, held in self.levels(req) for worker_id in held}

    def levels(self, req: Request) -> list[tuple[int, set[int]]]:
        """The workers holding ``req``'s first prefix block, nested by how many of its blocks,
        from the first, they hold: (that many, the workers holding at least that many), fewest
        first, so a worker's run is the deepest level it is in. The walk costs set operations
        on the holders of its first blocks, not a look at each, and copies none: the levels are
        the directory's own sets where every worker holding the last block kept also holds the
        next (the first block of a conversation is held by every worker), which the caller must
        not edit."""
        levels: list[tuple[int, set[int]]] = []
        left: set[int] = set()
        depth = 0
        prefix: tuple[Hashable, ...] = req.prefix
        for key in prefix:
            held = self.holders.get(key)
            if not held:
                break
            if depth and len(held) >= len(left) and held.issuperset(left):
                depth += 1
                continue
            kept = held if not depth else left & held
            if not kept:
                break
            if len(kept) < len(left):
                levels.append((depth, left))
            left, depth = kept, depth + 1
        if left:
            levels.append((depth, left))
        return levels

    def levels_with(self, req: Request, store: HostStore) -> tuple[list[tuple[int, set[int]]], int]:
        """``levels`` (nested as there) when every worker also loads from ``store`` (shared host
        memory, whose keys this directory does not list): the workers that reach deeper than
        every worker does, by depth, and the depth every worker reaches."""
        levels: list[tuple[int, set[int]]] = []
        left: set[int] = set()
        everyone: int | None = None
        depth = 0
        prefix: tuple[Hashable, ...] = req.prefix
        for key in prefix:
            if store.blocks(key) < 0:
                held = self.holders.get(key) or set()
                kept = held if everyone is None else left & held
                if everyone is None:
                    everyone = depth
                elif len(kept) < len(left):
                    levels.append((depth, left))
                left = kept
                if not left:
                    return levels, everyone
            depth += 1
        if everyone is None:
            return levels, depth
        levels.append((depth, left))
        return levels, everyone

    def deepest_holders(self, req: Request) -> set[int]:
        """The workers holding the deepest block of ``req``'s prefix that any worker holds along
        a run from its first block (empty if none holds its first): the directory's own set,
        which the caller must not edit."""
        deepest: set[int] = set()
        prefix: tuple[Hashable, ...] = req.prefix
        for key in prefix:
            held = self.holders.get(key)
            if not held:
                break
            deepest = held
        return deepest
