"""The chat template: how a conversation becomes token ids, the same for every tokenizer (gpt2, char, bpe:N).

    template = template_for(tok)
    ids, mask = template.encode_conversation(tok, [{"role": "user", "content": "hi"},
                                                   {"role": "assistant", "content": "hello"}])
    prompt = template.encode_prompt(tok, messages)        # ends with <|assistant|>: the model writes the reply

Layout, with nothing between the pieces:
    [<|system|> content <|end|>] (<|user|> content <|end|> <|assistant|> content <|end|>)+

The four markers are special tokens with the ids right above the tokenizer's vocabulary (base =
tok.vocab_size, ids base..base+3 in MARKERS' order), so no text encodes to them: every tokenizer's `encode`
returns ids below its vocab_size, and a message whose content holds the text "<|user|>" is that text, never
a turn. The mask is True where the loss trains: every assistant content token and the <|end|> that closes
an assistant turn (so the model learns to stop); False on markers, system and user turns.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Sequence

from errors import UserError, clipped

from .messages import check_messages

NAME = "smallgpt-chat-v1"
MARKERS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
ROLE_MARKER = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}


@dataclass(frozen=True)
class ChatTemplate:
    name: str  # NAME
    base: int  # the first marker's id: the tokenizer's vocab_size

    def id(self, marker: str) -> int:
        if marker not in MARKERS:
            raise UserError(f"{marker!r} is not a chat marker; the markers are {', '.join(MARKERS)}")
        return self.base + MARKERS.index(marker)

    @property
    def end(self) -> int:
        return self.base + 3

    @property
    def vocab_size(self) -> int:
        """The smallest model vocabulary that holds every marker."""
        return self.base + len(MARKERS)

    def stop_ids(self, tok) -> frozenset[int]:
        """What ends an assistant's reply: every marker (<|end|>, or a model starting a turn of its own) and
        the tokenizer's end-of-text. chat.py and serve.py stop on these."""
        return frozenset(range(self.base, self.vocab_size)) | {tok.eot}

    def _content(self, tok, message: dict, index: int) -> list[int]:
        try:
            ids = tok.encode(message["content"])
        except UserError as e:  # the char tokenizer: a character outside its vocabulary
            raise UserError(f"message {index + 1} ({message['role']}): {e}") from None
        # every tokenizer's encode stays below its vocab_size (no special tokens from text); a marker id
        # here would let text forge a turn, so it is checked, not assumed
        if any(not 0 <= i < self.base for i in ids):
            raise UserError(f"message {index + 1}: the {tok.name} tokenizer gave an id outside 0..{self.base - 1}; "
                            f"this tokenizer cannot be used with the chat template")
        return ids

    def _encode(self, tok, messages: list[dict]) -> tuple[list[int], list[bool]]:
        ids: list[int] = []
        mask: list[bool] = []
        for index, m in enumerate(messages):
            content = self._content(tok, m, index)
            train = m["role"] == "assistant"
            ids += [self.id(ROLE_MARKER[m["role"]]), *content, self.end]
            mask += [False, *[train] * len(content), train]
        return ids, mask

    def encode_conversation(self, tok, messages: Sequence[dict]) -> tuple[list[int], list[bool]]:
        """(ids, mask) of a whole conversation; UserError for messages that break the shape."""
        return self._encode(tok, check_messages(messages, "the conversation"))

    def encode_prompt(self, tok, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
        """The ids of `messages` (ending with a user turn) followed by <|assistant|>, which the model then
        continues with a reply and <|end|>. Without add_generation_prompt: the messages' ids alone."""
        checked = check_messages(messages, "the prompt", prompt=add_generation_prompt)
        ids = self._encode(tok, checked)[0]
        return ids + [self.id("<|assistant|>")] if add_generation_prompt else ids

    def decode(self, tok, ids: Sequence[int]) -> str:
        """The text of `ids`, markers (and any id at or above base, which no text encodes to) dropped."""
        return tok.decode([i for i in ids if i < self.base])

    def to_dict(self) -> dict:
        return {"name": self.name, "markers": {m: self.base + k for k, m in enumerate(MARKERS)}}

    @classmethod
    def from_dict(cls, d: Any) -> "ChatTemplate":
        """The template a checkpoint recorded; UserError in one line for a damaged entry."""
        fix = "the checkpoint's chat_template entry is damaged ({}); use another checkpoint or fine-tune again"
        if not isinstance(d, dict) or not isinstance(d.get("markers"), dict):
            raise UserError(fix.format("not a {name, markers} mapping"))
        if d.get("name") != NAME:
            raise UserError(fix.format(f"name {clipped(d.get('name'))}, not {NAME!r}"))
        markers = d["markers"]
        if set(markers) != set(MARKERS):  # (not sorted(): keys of several types, 1 and "<|user|>", don't sort)
            shown = ", ".join(clipped(k, 30) for k in itertools.islice(markers, 4)) + (", ..." if len(markers) > 4 else "")
            raise UserError(fix.format(f"its markers are {shown}, not {', '.join(MARKERS)}"))
        base = markers[MARKERS[0]]
        if isinstance(base, bool) or not isinstance(base, int) or base < 1:
            raise UserError(fix.format(f"{MARKERS[0]} has id {clipped(base, 20)}"))
        for k, m in enumerate(MARKERS):
            if markers[m] != base + k or isinstance(markers[m], bool):
                raise UserError(fix.format(f"{m} has id {clipped(markers[m], 20)}, not {clipped(base + k, 20)}"))
        return cls(NAME, base)


def template_for(tok) -> ChatTemplate:
    """The template for a tokenizer: the markers take the ids right above its vocabulary (gpt2: 50257..50260;
    char: len(chars) + 1.., since len(chars) is its eot; bpe:N: the trained vocabulary's size, which may be
    under N on a small corpus)."""
    return ChatTemplate(NAME, tok.vocab_size)
