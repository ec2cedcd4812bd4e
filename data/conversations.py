"""Conversations as data: rows {"messages": [{"role", "content"}, ...]} from every source data.dataset reads.

With data.format: chat every rows source (formats.py, hub.py) reads a row's messages_field, checks it here
(messages.py) and yields it as one document whose text is the messages as JSON: the prepare carries it like
any document (shards, manifest, resume) and data/chat_prep.py tokenizes it with the chat template.
API (for anything that reads conversations or takes messages):
    rows = chat_rows(cfg)                 # cfg: DataConfig with format: chat; spec= for data.val_dataset
    for conv in rows.read(pos):           # pos None: from the start; else a Conversation.pos seen before
        conv.pos, conv.messages           # where read() restarts at this row; checked [{"role", "content"}]
        ids, mask = template.encode_conversation(tok, conv.messages)   # data/chat_template.py
    rows.skipped()                        # {fault kind: count} of rows skipped (data.skip_bad_rows: true)
    skip_report(skip_counts(recs))        # the line to print per fault kind, from [file, row, fault] records
    check_messages(messages, where)       # the checked messages, or UserError "where: fault; fix the messages"
A bad row raises UserError "<file>, row <n>: <fault>; fix that row, or set data.skip_bad_rows: true ...".
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Any, Iterator, NamedTuple

from errors import UserError

from .config import CHAT
from .messages import (EMPTY, KINDS, NO_ASSISTANT, NO_MESSAGES, NO_ROLE_OR_CONTENT, NOT_A_LIST,  # noqa: F401
                       NOT_ALTERNATING, NOT_AN_OBJECT, NOT_TEXT, ROLES, SYSTEM_NOT_FIRST, TOO_LONG, UNKNOWN_ROLE,
                       UNREADABLE, check_messages, conversation_text, fault_kind, message_fault)
from .sources import open_source


class Conversation(NamedTuple):
    pos: Any  # where read() starts again at this row: [file index, row index] ([0, row index] for HF datasets)
    messages: list  # checked: [{"role", "content"}]
    advance: int  # how far a progress bar moves (bytes for files, rows for HF datasets)


def skip_counts(skipped: list) -> dict[str, int]:
    """{fault kind: count} of skipped rows, as sources record them: [file, row, fault] each."""
    return dict(Counter(fault_kind(row[2]) for row in skipped))


def skip_report(counts: dict[str, int]) -> str:
    """One line: how many rows were skipped, per fault kind; "" when none were."""
    if not counts:
        return ""
    parts = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"skipped {sum(counts.values())} bad conversation row(s) (data.skip_bad_rows): {parts}"


class ChatRows:
    """The conversations of one source: see the module docstring."""

    def __init__(self, source):
        self.source = source

    def read(self, pos: Any = None) -> Iterator[Conversation]:
        """The good conversations from `pos` on. Progress-only pieces between rows are added to the next
        conversation's advance (what follows the last one is not reported)."""
        pending = 0
        for piece in self.source.read(pos):
            pending += piece.advance
            if piece.new_doc:  # a chat row is one piece: its messages as JSON (messages.conversation_text)
                yield Conversation(piece.pos, json.loads(piece.text), pending)
                pending = 0

    def skipped(self) -> dict[str, int]:
        return skip_counts(self.source.skipped)


def chat_rows(cfg, spec: str | None = None, *, key: str = "data.dataset") -> ChatRows:
    """The conversations of cfg.dataset (or `spec`, named by the setting `key`), read as data.format: chat."""
    if cfg.format != CHAT:
        raise UserError("chat_rows reads conversations; set data.format: chat")
    return ChatRows(open_source(cfg, spec, tail_split=False, key=key))
