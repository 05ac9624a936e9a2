"""A worker's prefix cache in vLLM's shape: computed prompt blocks kept by chained hash.

A prompt names its blocks by keys (``Request.prefix``): the same key means the same tokens up to
the end of that block, so a cached run of keys from the first one is KV another request may
reuse. Blocks that a request on this worker references count as used KV; blocks no request
references stay cached, count as free, and are evicted least recently freed first (a request's
tail before its head, as vLLM frees them), only when room is needed. A key covers ``prefix_block``
tokens, a whole number of the worker's KV blocks; only its full KV blocks are cached.

With a host-memory store under it (``host``, a ``HostStore``: this worker's own, or one the
cluster shares), a block the pool evicts is kept there instead of lost; a request whose cached
run reaches into the store loads those blocks back into the pool when it references them
(``loaded_blocks`` counts them: the worker prices the loads). A block may be in both: a load
copies it.

Pure bookkeeping in blocks: ``KVPool`` owns the counts of used and free blocks and asks this
cache which blocks a request shares and which it may evict. Keys are typed ``Hashable``, not
``int``: compiled, an ``int`` read from the prompt is unboxed and boxed anew (an allocation) at
every dict and list it passes through, where an object is handed on as it is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Final

from tropical.core.request import Request
from tropical.sched.host_store import HostStore
from tropical.sched.prefix_directory import PrefixDirectory

RUNS_KEPT: Final = 4096
"""Lookups a cache keeps walked at most (a router that prices every request on every worker
would otherwise keep one per request it ever priced)."""

STALE_SLACK: Final = 64
"""Freed runs the eviction order may hold beyond twice the cached blocks before it drops the
blocks referenced again since (a cache that never evicts would otherwise queue a run per
release for ever)."""


@dataclass(slots=True)
class CachedBlock:
    """One cached prefix block: the KV blocks it fills, the requests here that reference it, and
    the release that last left it unreferenced (its place in the eviction order). A run builds
    half a million: a written constructor (see BatchShape)."""

    blocks: int
    refs: int
    freed: int

    def __init__(self, blocks: int, refs: int = 0) -> None:
        self.blocks = blocks
        self.refs = refs
        self.freed = 0


@dataclass(slots=True)
class FreedRun:
    """The blocks one release (numbered ``mark``) left unreferenced, head to tail: evicted from
    the end. A block whose ``freed`` is no longer ``mark``, or that is referenced, is not here
    any more."""

    mark: int
    keys: list[Hashable]

    def __init__(self, mark: int, keys: list[Hashable]) -> None:
        self.mark = mark
        self.keys = keys


@dataclass(slots=True)
class CachedRun:
    """How far a lookup walked one request's prefix: ``keys`` matched, their ``blocks``, whether
    the run ``ended`` at a partial block (no later key can extend it), and the cache's ``stores``
    when it last walked (one per request a lookup sees: a written constructor)."""

    keys: int
    blocks: int
    ended: bool
    stores: int

    def __init__(self) -> None:
        self.keys = 0
        self.blocks = 0
        self.ended = False
        self.stores = -1


@dataclass(slots=True)
class PrefixCache:
    """The prefix blocks one worker holds, who references them, and the eviction order of the
    unreferenced ones (``freed_runs``, oldest first). ``free_blocks`` counts the KV blocks of
    unreferenced cached prefix blocks (free KV that still serves hits); ``held`` the KV blocks
    each request here references; ``releases`` numbers the releases of referencing requests.
    ``evictions`` counts keys that left: until one does, a run found earlier can only grow, so a
    lookup goes on from its last walk instead of starting over (and, while ``stores``, the keys
    that entered, stays the same, has nothing to walk). A ``directory`` shared by the fleet
    learns which keys enter and leave here, as worker ``owner``'s (a key in this worker's own
    host store is still here; one in a shared store is any worker's, and the directory does not
    list it)."""

    block_size: int
    directory: PrefixDirectory | None = None
    owner: int = 0
    host: HostStore | None = None
    loaded_blocks: int = 0
    entries: dict[Hashable, CachedBlock] = field(default_factory=dict)
    freed_runs: deque[FreedRun] = field(default_factory=deque)
    refs: dict[int, list[Hashable]] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)
    free_blocks: int = 0
    evictions: int = 0
    stores: int = 0
    releases: int = 0
    _runs: dict[Request, CachedRun] = field(default_factory=dict)
    _runs_evictions: int = 0

    def blocks_of(self, req: Request, i: int) -> int:
        """Full KV blocks of ``req``'s prefix block ``i`` (the last one may be partial)."""
        return min(req.prefix_block, req.prompt_len - i * req.prefix_block) // self.block_size

    def held_tokens(self, req: Request) -> int:
        """Prompt tokens of ``req``'s KV here that are cached blocks it references."""
        return self.held.get(req.id, 0) * self.block_size

    def lookup(self, req: Request) -> int:
        """Prompt tokens of ``req`` cached here as a run of blocks from its first (the toggle
        asks of many workers per decision: each walk goes on from where the last one stopped,
        and starts over only after an eviction)."""
        evictions, stores, store = self.evictions, self.stores, self.host
        if store is not None:
            evictions += store.evictions
            stores += store.puts
        if self._runs_evictions != evictions or len(self._runs) > RUNS_KEPT:
            self._runs, self._runs_evictions = {}, evictions
        run = self._runs.get(req)
        if run is None:
            run = self._runs[req] = CachedRun()
        if not run.ended and run.stores != stores:
            run.stores = stores
            self._extend(req, run)
        return run.blocks * self.block_size

    def _extend(self, req: Request, run: CachedRun) -> None:
        """Walk ``req``'s prefix on from ``run``'s end while its keys are cached; a partial
        block, its prompt's last, ends the run for good."""
        whole = req.prefix_block // self.block_size
        prefix: tuple[Hashable, ...] = req.prefix
        entries = self.entries
        while run.keys < len(prefix):
            entry = entries.get(prefix[run.keys])
            blocks = self._host_blocks(prefix[run.keys]) if entry is None else entry.blocks
            if blocks < 0:
                return
            run.keys += 1
            run.blocks += blocks
            if blocks < whole:
                break
        run.ended = True

    @property
    def may_load(self) -> bool:
        """Could a reference here load anything from host memory (a store that holds blocks)?"""
        return self.host is not None and self.host.held > 0

    def _host_blocks(self, key: Hashable) -> int:
        """KV blocks of ``key`` in the host store (-1: not there)."""
        return -1 if self.host is None else self.host.blocks(key)

    def host_tokens(self, req: Request) -> int:
        """Prompt tokens of ``req``'s cached run that a reference here would load from host
        memory."""
        return self._unreferenced(req, True) * self.block_size

    def unreferenced_run(self, req: Request) -> int:
        """KV blocks of ``req``'s cached run that no request references (referencing them
        makes them used)."""
        return self._unreferenced(req, False)

    def _unreferenced(self, req: Request, host_only: bool) -> int:
        """KV blocks of ``req``'s cached run that no request here references (``host_only``:
        those of them only in host memory)."""
        blocks = 0
        whole = req.prefix_block // self.block_size
        prefix: tuple[Hashable, ...] = req.prefix
        for key in prefix:
            entry = self.entries.get(key)
            held = self._host_blocks(key) if entry is None else entry.blocks
            if held < 0:
                break
            if entry is None or (entry.refs == 0 and not host_only):
                blocks += held
            if held < whole:
                break
        return blocks

    def pin(self, req: Request) -> int:
        """Reference ``req``'s cached run for as long as it stays here; returns the KV blocks
        that were free (unreferenced, or in host memory: loaded back) and are now used."""
        keys = self.refs.setdefault(req.id, [])
        whole = req.prefix_block // self.block_size
        revived = 0
        prefix: tuple[Hashable, ...] = req.prefix
        for key in prefix[len(keys):]:
            entry = self.entries.get(key)
            if entry is None:
                entry = self._load(key)
            if entry is None:
                break
            revived += self._reference(req, entry)
            keys.append(key)
            if entry.blocks < whole:
                break
        return revived

    def _load(self, key: Hashable) -> CachedBlock | None:
        """Copy ``key`` from the host store into the pool as an unreferenced cached block (None:
        not there)."""
        blocks = self._host_blocks(key)
        if blocks < 0:
            return None
        store = self.host
        assert store is not None
        store.touch(key)
        if store.shared and self.directory is not None:
            self.directory.add(key, self.owner)
        self.loaded_blocks += blocks
        self.free_blocks += blocks
        entry = self.entries[key] = CachedBlock(blocks)
        return entry

    def _reference(self, req: Request, entry: CachedBlock) -> int:
        """``req`` references ``entry``; returns its blocks if nobody did (now used, not free)."""
        self.held[req.id] = self.held.get(req.id, 0) + entry.blocks
        entry.refs += 1
        if entry.refs > 1:
            return 0
        self.free_blocks -= entry.blocks
        return entry.blocks

    def store(self, req: Request, tokens: int) -> tuple[int, int, int]:
        """``req`` has the KV of its first ``tokens`` prompt tokens here: its full prefix blocks
        among them become cached blocks it references. A block already cached (another request
        computed it meanwhile) is shared, and ``req``'s own copy freed. Returns, in KV blocks:
        ``req``'s own blocks now in the cache's care, those of them freed as copies, and cached
        blocks that were free and are now used (referenced again)."""
        keys = self.refs.get(req.id)
        i = 0 if keys is None else len(keys)
        if i >= len(req.prefix) or (i + 1) * req.prefix_block > tokens < req.prompt_len:
            return 0, 0, 0                   # the next block is not whole yet (most chunks)
        if keys is None:
            keys = self.refs[req.id] = []
        moved = copies = revived = new = 0
        prefix: tuple[Hashable, ...] = req.prefix
        entries, size, span = self.entries, self.block_size, req.prefix_block
        whole = span // size
        while i < len(prefix):
            blocks = whole if (i + 1) * span <= req.prompt_len else self.blocks_of(req, i)
            if blocks == 0 or i * span + blocks * size > tokens:
                break
            key = prefix[i]
            entry = entries.get(key)
            if entry is None:
                entries[key] = CachedBlock(blocks, 1)
                if self.directory is not None:
                    self.directory.add(key, self.owner)
                new += blocks
                self.stores += 1
            else:
                revived += self._reference(req, entry)
                copies += blocks
            moved += blocks
            keys.append(key)
            i += 1
        self.held[req.id] = self.held.get(req.id, 0) + new
        return moved, copies, revived

    def release(self, req: Request) -> int:
        """``req`` leaves this worker: its cached blocks lose a reference, and those no request
        references any more join the eviction order as one run, tail first. Returns the KV
        blocks that were used and are now free (still cached)."""
        self.held.pop(req.id, None)
        keys = self.refs.pop(req.id, None)
        if not keys:
            return 0
        self.releases += 1
        mark, entries, freed = self.releases, self.entries, 0
        for key in keys:
            entry = entries[key]
            entry.refs -= 1
            if entry.refs == 0:
                entry.freed = mark
                freed += entry.blocks
        if freed:
            if len(self.freed_runs) > 2 * len(entries) + STALE_SLACK:
                self._compact()
            self.freed_runs.append(FreedRun(mark, keys))
            self.free_blocks += freed
        return freed

    def _queued(self, key: Hashable, mark: int) -> CachedBlock | None:
        """``key``'s entry if it is in the eviction order at release ``mark``'s place."""
        entry = self.entries.get(key)
        return entry if entry is not None and entry.refs == 0 and entry.freed == mark else None

    def _compact(self) -> None:
        """Drop from the eviction order the blocks referenced or evicted since their release."""
        runs: deque[FreedRun] = deque()
        for run in self.freed_runs:
            keys = [key for key in run.keys if self._queued(key, run.mark) is not None]
            if keys:
                runs.append(FreedRun(run.mark, keys))
        self.freed_runs = runs

    def eviction_order(self) -> list[Hashable]:
        """The unreferenced cached keys, in the order eviction takes them."""
        return [key for run in self.freed_runs for key in reversed(run.keys)
                if self._queued(key, run.mark) is not None]

    def evict(self, blocks: int) -> None:
        """Drop unreferenced cached blocks, least recently freed first, until ``blocks`` KV
        blocks are no longer cached."""
        runs, entries, directory = self.freed_runs, self.entries, self.directory
        while blocks > 0 and runs:
            run = runs[0]
            keys, mark = run.keys, run.mark
            while keys and blocks > 0:
                key = keys.pop()
                entry = entries.get(key)
                if entry is None or entry.refs or entry.freed != mark:
                    continue
                del entries[key]
                self.free_blocks -= entry.blocks
                blocks -= entry.blocks
                if self.host is not None:
                    self._offload(key, entry.blocks)
                    continue
                if directory is not None:
                    directory.remove(key, self.owner)
                self.evictions += 1
            if not keys:
                runs.popleft()

    def _offload(self, key: Hashable, blocks: int) -> None:
        """``key`` left the pool for the host store; keys the store drops for room leave this
        worker for good unless its pool holds them (a shared store's are not listed as its)."""
        store, directory = self.host, self.directory
        assert store is not None
        gone = store.put(key, blocks)
        if directory is None:
            return
        if store.shared:
            directory.remove(key, self.owner)
            return
        for old in gone:
            if old not in self.entries:
                directory.remove(old, self.owner)

    def clear(self) -> None:
        """Evict every unreferenced cached block (to the host store where there is one)."""
        self.evict(self.free_blocks)

    def forget(self, keys: Iterable[int]) -> list[int]:
        """The worker this models evicted ``keys`` (its KV events say so): those cached here that
        no request references leave at once. Returns the keys a request here still references:
        the model and the worker disagree on them."""
        disagree = []
        for key in keys:
            entry = self.entries.get(key)
            if entry is None:
                continue
            if entry.refs:
                disagree.append(key)
                continue
            del self.entries[key]
            if self.directory is not None:
                self.directory.remove(key, self.owner)
            self.free_blocks -= entry.blocks
            self.evictions += 1
        return disagree
