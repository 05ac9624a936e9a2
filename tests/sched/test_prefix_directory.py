"""The fleet's prefix directory: each worker's run of a prompt's prefix blocks, read from levels
nested by depth without copying the holders of blocks that every worker keeps holding."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sched.test_prefix_cache import BLOCK, prefixed
from tropical.sched.prefix_directory import KEPT_FROM, KEPT_MOST, PrefixDirectory

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


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1), st.integers(0, 79)), max_size=300))
def test_a_kept_array_of_holders_always_matches_its_set(steps: list[tuple[bool, int, int]]) -> None:
    """Sets large enough to be kept (``KEPT_FROM``) are asked for after every add and remove: the
    array ``ids`` gives is the set's, never one kept from before the set changed."""
    directory = PrefixDirectory()
    for worker_id in range(KEPT_FROM + 8):
        directory.add(0, worker_id)
        directory.add(1, worker_id)
    for adds, key, worker_id in steps:
        (directory.add if adds else directory.remove)(key, worker_id)
        for held in directory.holders.values():
            assert sorted(directory.ids(held).tolist()) == sorted(held)


def test_kept_arrays_are_dropped_past_their_limit_and_small_sets_never_kept() -> None:
    directory = PrefixDirectory()
    small = {1, 2, 3}
    assert sorted(directory.ids(small).tolist()) == [1, 2, 3]
    assert not directory.arrays
    sets = [set(range(i, i + KEPT_FROM)) for i in range(KEPT_MOST + 1)]
    for held in sets:
        directory.ids(held)
    assert len(directory.arrays) == 1
    assert directory.ids(sets[-1]) is directory.ids(sets[-1])
