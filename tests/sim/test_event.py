"""The simulator's event queue orders by time, then first come, first served."""

from heapq import heappop, heappush

from hypothesis import given
from hypothesis import strategies as st

from tropical.sim.event import Event


@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5]), min_size=1, max_size=40))
def test_events_pop_by_time_and_equal_times_in_the_order_they_were_queued(times):
    heap: list[Event] = []
    for seq, time in enumerate(times):
        heappush(heap, Event(time, seq, 0, (seq,)))
    popped = [heappop(heap) for _ in times]
    assert [(e.time, e.seq) for e in popped] == sorted((t, s) for s, t in enumerate(times))
    assert [e.payload for e in popped] == [(e.seq,) for e in popped]


def test_an_event_is_earlier_than_another_only_by_time_then_by_its_place_in_the_queue():
    assert Event(1.0, 5, 1, ()) < Event(2.0, 0, 0, ())
    assert Event(1.0, 0, 1, ()) < Event(1.0, 1, 0, ())
    assert not Event(1.0, 1, 0, ()) < Event(1.0, 1, 0, ())
