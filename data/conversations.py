"""Conversations as data: rows {"messages": [{"role", "content"}, ...]} from every source data.dataset reads.

API (for the SFT preparation and for anything that takes messages):
    rows = chat_rows(cfg)                 # cfg: DataConfig with format: chat; spec= for data.val_dataset
    for conv in rows.read(pos):           # pos None: from the start; else a Conversation.pos seen before
        conv.pos, conv.where, conv.row    # where read() restarts at this row; file (or dataset) and row number
        conv.messages, conv.advance       # validated [{"role", "content"}]; progress (bytes, or rows for HF)
        ids, mask = template.encode_conversation(tok, conv.messages)   # data/chat_template.py
    rows.source                           # the Source (identity and files, for the fingerprint)
    rows.skipped()                        # {fault kind: count} of rows skipped (data.skip_bad_rows: true)
    print(skip_report(rows.skipped()))    # the one line to print when any were skipped ("" when none)
    check_messages(messages, where)       # the validated messages, or UserError "where: fault; fix"
A bad row raises UserError "<file>, row <n>: <fault>; fix that row, or set data.skip_bad_rows: true ...".
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterator

from errors import UserError

from .messages import (EMPTY, NO_ASSISTANT, NO_MESSAGES, NO_ROLE_OR_CONTENT, NOT_A_LIST, NOT_ALTERNATING,  # noqa: F401
                       NOT_AN_OBJECT, NOT_TEXT, ROLES, SYSTEM_NOT_FIRST, UNKNOWN_ROLE, UNREADABLE, Conversation, Fault,
                       check_messages, message_fault)
from .sources import open_source


def fault_kind(why: str) -> str:
    return getattr(why, "kind", UNREADABLE)


def skip_report(skipped: dict[str, int]) -> str:
    """One line: how many rows were skipped, per fault kind; "" when none were."""
    if not skipped:
        return ""
    parts = ", ".join(f"{n} {kind}" for kind, n in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"skipped {sum(skipped.values())} bad conversation row(s) (data.skip_bad_rows): {parts}"


class ChatRows:
    """The conversations of one source: see the module docstring."""

    def __init__(self, source, skipped: dict[str, int] | None = None):
        self.source = source
        self._before = Counter(skipped or {})  # counts a resumed preparation carried over

    def read(self, pos: Any = None) -> Iterator[Conversation]:
        """The valid conversations from `pos` on. Progress-only pieces between rows are added to the next
        conversation's advance (what follows the last one is not reported)."""
        pending = 0
        for item in self.source.read(pos):
            if isinstance(item, Conversation):
                yield item._replace(advance=item.advance + pending) if pending else item
                pending = 0
            else:  # a Piece the file readers yield for progress alone
                pending += item.advance

    def skipped(self) -> dict[str, int]:
        counts = self._before + Counter(fault_kind(why) for _, _, why in self.source.skipped)
        return dict(counts)


def chat_rows(cfg, spec: str | None = None, *, key: str = "data.dataset",
              skipped: dict[str, int] | None = None) -> ChatRows:
    """The conversations of cfg.dataset (or `spec`, named by the setting `key`) read as data.format: chat.
    `skipped`: the counts a killed preparation recorded, so the total printed at the end covers every row."""
    if getattr(cfg, "format", "text") != "chat":
        raise UserError("chat_rows needs data.format: chat")
    return ChatRows(open_source(cfg, spec, tail_split=False, key=key), skipped)
