"""The fleet's prefix directory: each worker's run of a prompt's prefix blocks, read from levels
nested by depth without copying the holders of blocks that every worker keeps holding."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sched.test_prefix_cache import BLOCK, prefixed
from tropical.sched.prefix_directory import PrefixDirectory

WORKERS = 6


def run_of(directory: PrefixDirectory, prefix: tuple[int, ...], worker_id: int) -> int:
    """How many of ``prefix``'s blocks, from the first, ``worker_id`` holds: counted block by block."""
    run = 0
    for key in prefix:
        if worker_id not in directory.holders.get(key, set()):
            break
        run += 1
    return run


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sets(st.integers(0, WORKERS - 1)), min_size=1, max_size=6))
def test_each_worker_s_run_is_the_deepest_level_it_is_in(held: list[set[int]]) -> None:
    directory = PrefixDirectory()
    prefix = tuple(range(100, 100 + len(held)))
    for key, workers in zip(prefix, held, strict=True):
        for worker_id in workers:
            directory.add(key, worker_id)
    req = prefixed(0, prefix, BLOCK * len(prefix))
    levels = directory.levels(req)
    assert [depth for depth, _ in levels] == sorted({depth for depth, _ in levels})
    assert all(deeper <= shallower for (_, shallower), (_, deeper) in zip(levels, levels[1:], strict=False))
    for worker_id in range(WORKERS):
        run = run_of(directory, prefix, worker_id)
        deepest = next((depth for depth, workers in reversed(levels) if worker_id in workers), 0)
        assert deepest == run
    assert directory.runs(req) == {w: run_of(directory, prefix, w) for w in range(WORKERS)
                                   if run_of(directory, prefix, w) > 0}


def test_the_holders_of_a_block_every_worker_holds_are_read_not_copied() -> None:
    directory = PrefixDirectory()
    for worker_id in range(WORKERS):
        directory.add(1, worker_id)
    directory.add(2, 3)
    levels = directory.levels(prefixed(0, (1, 2), 2 * BLOCK))
    assert levels == [(1, set(range(WORKERS))), (2, {3})]
    assert levels[0][1] is directory.holders[1]
