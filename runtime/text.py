"""Text around generation, shared by sample.py, chat.py, serve.py and the showcase: the default prompt of
an unprompted sample, and tokens turned into text as they are generated (TextStream for whoever sends the
text on, e.g. a server's events; StreamPrinter for a terminal)."""
from __future__ import annotations

DEFAULT_PROMPT = "\n"  # as in nanoGPT; a vocabulary without a newline starts from end-of-text instead


class TextStream:
    """Token ids in, text out, piece by piece. Token boundaries can fall inside a multi-byte character
    (GPT-2's BPE works on bytes), so tokens are decoded together, not one by one: while the decoded
    pending tokens end in U+FFFD (an incomplete character) they are held back; once they end on a whole
    character they are given out and dropped. UTF-8 is self-synchronising, so that point is a character
    boundary and the pieces join up to the decode of all the tokens. `decode` maps ids to text (a
    tokenizer's decode, or a chat template's, which drops the markers)."""

    def __init__(self, decode):
        self.decode = decode
        self.pending: list[int] = []

    def add(self, token: int) -> str:
        """The text that `token` completes ("" while a character is still incomplete)."""
        self.pending.append(token)
        text = self.decode(self.pending)
        if text.endswith("\ufffd"):
            return ""
        self.pending.clear()
        return text

    def finish(self) -> str:
        """What is still held back (an incomplete character stays U+FFFD), and a fresh start."""
        text = self.decode(self.pending) if self.pending else ""
        self.pending.clear()
        return text


class StreamPrinter:
    """Prints tokens as text to `out` as they arrive (TextStream's rule), flushing each piece."""

    def __init__(self, tok, out):
        self.tok, self.out = tok, out
        self.stream = TextStream(tok.decode)

    def add(self, token: int) -> None:
        text = self.stream.add(token)
        if text:
            self.out.write(text)
            self.out.flush()

    def finish(self) -> None:
        self.out.write(self.stream.finish() + "\n")
        self.out.flush()
