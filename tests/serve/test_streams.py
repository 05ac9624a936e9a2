"""A request's events: each says how many tokens it carries, and the finish reason rides with the
last tokens, so streamed chunks tell per-token latency apart from gaps between chunks."""

from __future__ import annotations

from tests.factories import make_request
from tropical.engine.sampling import SamplingParams
from tropical.serve.streams import Event, RequestHandle, Submission

E_ACUTE = (0xC3, 0xA9)  # "é": two byte tokens, the first makes no text on its own


class ByteDecoder:
    """Each token id is one UTF-8 byte, so a character can take two tokens."""

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def handle(stop: list[str] | None = None) -> RequestHandle:
    submission = Submission([1, 2], 8, SamplingParams(), stop or [], ignore_eos=True)
    return RequestHandle.of(make_request(), submission, ByteDecoder())


def taken(h: RequestHandle) -> list[Event]:
    """What a reader takes from the queue now."""
    events = []
    while not h.events.empty():
        events.append(h.events.get_nowait())
    return events


def test_a_token_without_text_rides_with_the_next_event_and_is_counted_there():
    h = handle()
    h.emit([ord("a")])
    assert taken(h) == [Event("a", 1)]
    h.emit([E_ACUTE[0]])
    assert taken(h) == []
    h.emit([E_ACUTE[1]])
    assert taken(h) == [Event("é", 2)]


def test_the_first_token_gets_an_event_even_without_text():
    h = handle()
    h.emit([E_ACUTE[0]])
    assert taken(h) == [Event("", 1)]


def test_the_finish_reason_rides_with_the_last_unread_tokens():
    h = handle()
    h.emit([ord("a")])
    taken(h)
    h.emit([ord("b")])
    h.emit([ord("c")])
    h.end("length")
    assert taken(h) == [Event("b", 1), Event("c", 1, "length")]


def test_a_final_event_after_the_reader_took_everything_carries_the_held_back_tokens():
    h = handle()
    h.emit([ord("a")])
    h.emit([E_ACUTE[0]])
    taken(h)
    h.end("length")
    [final] = taken(h)
    assert (final.tokens, final.finish_reason) == (1, "length") and final.final


def test_event_token_counts_add_up_to_the_completion_tokens_with_a_stop_string():
    h = handle(stop=["bc"])
    events = []
    for token in (ord("a"), *E_ACUTE, ord("b"), ord("c")):
        if h.emit([token]):
            break
        events += taken(h)
    h.end("stop")
    events += taken(h)
    assert "".join(e.text for e in events) == "aé" and events[-1].finish_reason == "stop"
    assert sum(e.tokens for e in events) == h.completion_tokens == 5


def test_an_error_ends_the_stream_without_text_or_tokens():
    h = handle()
    h.emit([ord("a")])
    h.end(error="worker died")
    assert taken(h)[-1] == Event("", 0, None, "worker died")
