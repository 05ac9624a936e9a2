"""Incremental detokenization for streaming: text deltas that never need taking back.

A token may end mid-way through a UTF-8 character, and the text just decoded may be the start of a stop
string, so both are held back until the next tokens settle them. Each step decodes only a short window of
recent tokens (vLLM's prefix/read offsets), keeping a long output linear rather than quadratic; the window
starts one settled chunk early so tokenizers that treat the first token specially (a leading space) decode
the new tokens as they would in the full text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


@dataclass
class TextStream:
    """One request's output text. `push` each step's new tokens, then `finish` once; stop when `stopped`."""

    tokenizer: Decoder
    stops: list[str]
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0  # the window decoded each step is ids[prefix_offset:]
    read_offset: int = 0  # tokens before this had all their text settled when the window last moved
    taken: int = 0  # characters of the window's text already moved to `held` or emitted
    held: str = ""  # settled text that could still begin a stop string
    stopped: bool = False

    def __post_init__(self) -> None:
        assert all(self.stops), "stop strings must be non-empty"

    def push(self, token_ids: list[int]) -> str:
        """The text that became final with these tokens."""
        if self.stopped:
            return ""
        self.ids.extend(token_ids)
        self.held += self._settled_text(final=False)
        return self._release()

    def finish(self) -> str:
        """Everything still held back: a trailing partial character decodes as it stands."""
        if self.stopped:
            return ""
        self.held += self._settled_text(final=True)
        text = self._release()
        if not self.stopped:
            text, self.held = text + self.held, ""
        return text

    def _settled_text(self, final: bool) -> str:
        """New window text, minus trailing replacement characters that later bytes may complete."""
        text = self.tokenizer.decode(self.ids[self.prefix_offset:])
        end = len(text)
        while not final and end > self.taken and text[end - 1] == REPLACEMENT:
            end -= 1
        new, self.taken = text[self.taken:end], max(self.taken, end)
        if end == len(text):
            self._slide_window()
        return new

    def _slide_window(self) -> None:
        """Start the window at the last settled boundary; everything decoded so far is taken."""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.taken = len(self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset]))

    def _release(self) -> str:
        """Emit held text up to a stop string (then stop) or up to a tail that may begin one."""
        cut = first_stop(self.held, self.stops)
        if cut is not None:
            text, self.held, self.stopped = self.held[:cut], "", True
            return text
        keep = len(self.held) - stop_prefix_len(self.held, self.stops)
        text, self.held = self.held[:keep], self.held[keep:]
        return text


def first_stop(text: str, stops: list[str]) -> int | None:
    """Where the earliest stop string in `text` begins, as the engine trims (`trim_at_stop`)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found, default=None)


def stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of some stop string."""
    longest = min(len(text), max((len(s) - 1 for s in stops), default=0))
    for n in range(longest, 0, -1):
        if any(s.startswith(text[-n:]) for s in stops):
            return n
    return 0
