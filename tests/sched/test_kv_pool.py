"""KVPool's arithmetic: what ``fits`` accepts and what ``room_tokens`` promises agree."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tropical.sched.kv import KVPool


@given(st.integers(1, 64), st.integers(1, 32), st.integers(0, 64))
def test_room_tokens_is_the_most_tokens_that_fit(capacity: int, block: int, used: int) -> None:
    pool = KVPool(capacity, block, min(used, capacity))
    room = pool.room_tokens()
    assert pool.fits(room)
    assert not pool.fits(room + 1)
