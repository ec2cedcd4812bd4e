"""A reply's text as its tokens arrive, cut before the first stop string.

runtime/text.py's TextStream (the one shared with chat.py and sample.py) turns tokens into whole
characters; on top of it the last (longest stop - 1) characters are held back, so that no part of a stop
string is ever sent before the stop is recognised.
"""
from __future__ import annotations

from typing import Callable, Sequence

from runtime.text import TextStream


class StopText:
    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str] = ()):
        self.chars = TextStream(decode)
        self.stops = tuple(stops)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""  # everything the tokens so far decode to (whole characters)
        self.sent = 0  # characters of it already handed out
        self.tokens = 0
        self.stopped = False  # a stop string was found: nothing more is handed out

    def push(self, token: int) -> str:
        """The new text that is safe to send after `token` ("" while held)."""
        if self.stopped:
            return ""
        self.tokens += 1
        return self._more(self.chars.add(token), final=False)

    def flush(self) -> str:
        """What was held back, once the reply has ended."""
        return "" if self.stopped else self._more(self.chars.finish(), final=True)

    def _more(self, piece: str, final: bool) -> str:
        self.text += piece
        # a stop can only end in the new piece: search from where a stop ending there could begin
        start = max(0, len(self.text) - len(piece) - self.hold)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            end = max(min(hits), self.sent)
        else:
            end = len(self.text) if final else len(self.text) - self.hold
        if end <= self.sent:
            return ""
        new, self.sent = self.text[self.sent:end], end
        return new
