"""The engine's KV blocks as vLLM's block pool hands them out: free blocks, and full prompt blocks
kept by hash for reuse after the sequences that computed them are gone.

Every block is either referenced by sequences (``refs`` > 0), cached and unreferenced (in the LRU
free queue: free, yet still serving hits), or plain free. Allocation takes plain free blocks first
and evicts cached ones only when none is left, least recently freed first; a sequence frees its
blocks tail first, so a finished prompt's tail goes before its head. Each change of what is
cached is recorded as a KV event for the router.
"""

from __future__ import annotations

from collections import OrderedDict

from tropical.engine.kv_events import BlockRemoved, BlockStored, KVEvent


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` tokens; ``events`` holds the cache's changes until
    ``take_events``."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.refs = [0] * num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._hash_of: dict[int, int] = {}
        self._block_of: dict[int, int] = {}
        self.events: list[KVEvent] = []

    @property
    def num_free(self) -> int:
        """Blocks no sequence references, cached ones included."""
        return len(self._free) + len(self._lru)

    @property
    def cached_hashes(self) -> set[int]:
        return set(self._block_of)

    def allocate(self, count: int) -> list[int]:
        """``count`` blocks for one sequence; cached blocks are evicted only when no plain free
        block is left."""
        if count > self.num_free:
            raise MemoryError(f"KV cache out of blocks: {count} needed, {self.num_free} free")
        taken = [self._free.pop() for _ in range(min(count, len(self._free)))]
        evicted = []
        while len(taken) < count:
            block, _ = self._lru.popitem(last=False)
            name = self._hash_of.pop(block)
            del self._block_of[name]
            evicted.append(name)
            taken.append(block)
        if evicted:
            self.events.append(BlockRemoved(tuple(evicted)))
        for block in taken:
            self.refs[block] = 1
        return taken

    def cached_run(self, hashes: tuple[int, ...]) -> list[int]:
        """Reference the cached blocks of ``hashes`` from the first on, up to the first missing."""
        run = []
        for name in hashes:
            block = self._block_of.get(name)
            if block is None:
                break
            self._reference(block)
            run.append(block)
        return run

    def _reference(self, block: int) -> None:
        self.refs[block] += 1
        if self.refs[block] == 1:
            del self._lru[block]

    def store(self, table: list[int], start: int, hashes: tuple[int, ...]) -> None:
        """Cache the full blocks ``table[start:len(hashes)]``, just computed. A block already cached
        under its hash (another sequence computed it meanwhile) replaces it in ``table``, and the
        copy is freed, so equal prefixes share one block."""
        run: list[int] = []
        for i in range(start, len(hashes)):
            name, block = hashes[i], table[i]
            cached = self._block_of.get(name)
            if cached is None:
                self._block_of[name], self._hash_of[block] = block, name
                run.append(name)
                continue
            self._flush(run, hashes, i)
            run = []
            self._reference(cached)
            self.free([block])
            table[i] = cached
        self._flush(run, hashes, len(hashes))

    def _flush(self, run: list[int], hashes: tuple[int, ...], end: int) -> None:
        """One BlockStored for a run of blocks stored together, ending before ``hashes[end]``."""
        if run:
            first = end - len(run)
            parent = hashes[first - 1] if first else None
            self.events.append(BlockStored(tuple(run), parent, self.block_size))

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each of ``blocks``, in order: cached ones no sequence references
        join the back of the LRU queue, the rest are plain free."""
        for block in blocks:
            self.refs[block] -= 1
            assert self.refs[block] >= 0, f"block {block} freed more often than it was taken"
            if self.refs[block] == 0:
                if block in self._hash_of:
                    self._lru[block] = None
                else:
                    self._free.append(block)

    def take_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events
