"""Token ids to text as they arrive: only whole characters, and never past a stop string.

A byte-level BPE token can end inside a UTF-8 character (the decoded prefix then ends in U+FFFD): that
tail is held until the character completes. With stop strings the last (longest stop - 1) characters are
held too, so no part of a stop string is ever sent before the stop is recognised.
"""
from __future__ import annotations

from typing import Callable, Sequence


class TextStream:
    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str] = ()):
        self.decode, self.stops = decode, tuple(stops)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already handed out
        self.stopped = False  # a stop string was found: nothing more is handed out

    def push(self, token: int) -> str:
        """The new text that is safe to send after `token` ("" while held)."""
        if self.stopped:
            return ""
        self.ids.append(token)
        text = self.decode(self.ids)
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            return self._take(text, max(min(hits), self.sent))
        safe = len(text.rstrip("\ufffd")) - self.hold
        return self._take(text, safe) if safe > self.sent else ""

    def flush(self) -> str:
        """What was held back, once the reply has ended."""
        return "" if self.stopped else self._take(self.decode(self.ids), None)

    def _take(self, text: str, end: int | None) -> str:
        end = len(text) if end is None else end
        new, self.sent = text[self.sent:end], max(self.sent, end)
        return new
