import pytest

from tests.benchmarks.scripts import load
from tropical.workload.trace import PREFIX_BLOCK_TOKENS, Trace, TraceEntry

offline = load("eviction_offline")
B = PREFIX_BLOCK_TOKENS


def test_reuse_gaps_count_history_blocks_only_and_the_cache_holds_seconds_of_new_blocks():
    trace = [TraceEntry(0.0, 2 * B, 1, (0, 1)), TraceEntry(10.0, 3 * B, 1, (0, 1, 2)),
             TraceEntry(40.0, 2 * B, 1, (0, 1))]
    assert offline.reuse_gaps(trace) == [10.0, 30.0]           # block 1 again; block 0 left out
    assert offline.held_seconds(Trace("t", tuple(trace)), B) == pytest.approx(B / (3 * B / 40.0))
