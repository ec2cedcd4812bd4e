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
from typing import Any, Iterator, NamedTuple, Sequence

from errors import UserError

ROLES = ("system", "user", "assistant")

# fault kinds: what a skipped row is counted under (one per class of bad row)
NO_MESSAGES = "no messages field"
NOT_A_LIST = "messages not a list"
NOT_AN_OBJECT = "message not an object"
NO_ROLE_OR_CONTENT = "message without role or content"
UNKNOWN_ROLE = "unknown role"
EMPTY = "empty content"
NOT_TEXT = "content not text"
SYSTEM_NOT_FIRST = "system not first"
NOT_ALTERNATING = "turns not alternating"
NO_ASSISTANT = "no assistant turn"
UNREADABLE = "unreadable row"  # not JSON, not UTF-8, not an object: what formats.py says of any row


class Fault(str):
    """A bad row's one-line fault, carrying the kind it is counted under when skipped."""

    kind: str

    def __new__(cls, text: str, kind: str) -> "Fault":
        f = super().__new__(cls, text)
        f.kind = kind
        return f


def message_fault(messages: Any, prompt: bool = False) -> Fault | None:
    """What is wrong with `messages`, or None. A conversation is [system] (user assistant)+; a prompt
    (prompt=True) is [system] (user assistant)* user. Keys other than role and content (OpenAI's "name",
    a dataset's ids) are ignored: they do not change the text the model sees."""
    if not isinstance(messages, (list, tuple)):
        return Fault(f"its messages are a {type(messages).__name__}, not a list of "
                     f"{{\"role\", \"content\"}} objects", NOT_A_LIST)
    for k, m in enumerate(messages, 1):
        if not isinstance(m, dict):
            return Fault(f"message {k} is a {type(m).__name__}, not an object with role and content", NOT_AN_OBJECT)
        missing = [key for key in ("role", "content") if key not in m]
        if missing:
            return Fault(f"message {k} has no {missing[0]!r}", NO_ROLE_OR_CONTENT)
        role, content = m["role"], m["content"]
        if role not in ROLES:
            return Fault(f"message {k} has role {str(role)[:40]!r}; the roles are system, user and assistant",
                         UNKNOWN_ROLE)
        if not isinstance(content, str):
            what = "null" if content is None else f"a {type(content).__name__}"
            return Fault(f"message {k} ({role}) has {what} as content, not text", NOT_TEXT)
        if not content.strip():
            return Fault(f"message {k} ({role}) has empty content", EMPTY)
    turns = list(messages)
    if turns and turns[0]["role"] == "system":
        turns = turns[1:]
    offset = len(messages) - len(turns)
    for k, m in enumerate(turns):
        if m["role"] == "system":
            return Fault(f"message {k + offset + 1} is a system turn; only the first message may be", SYSTEM_NOT_FIRST)
        want = ("user", "assistant")[k % 2]
        if m["role"] != want:
            after = f"after a {turns[k - 1]['role']} turn" if k else "first (after an optional system turn)"
            return Fault(f"message {k + offset + 1} is a {m['role']} turn {after}; turns alternate user, assistant, "
                         f"user, ...", NOT_ALTERNATING)
    if prompt:
        if not turns or turns[-1]["role"] != "user":
            return Fault("it does not end with a user turn to reply to", NOT_ALTERNATING)
        return None
    if not any(m["role"] == "assistant" for m in turns):
        return Fault("it has no assistant turn" if messages else "it has no messages", NO_ASSISTANT)
    if turns[-1]["role"] != "assistant":
        return Fault(f"its last message ({len(messages)}) is a user turn with no reply", NOT_ALTERNATING)
    return None


def check_messages(messages: Any, where: str, prompt: bool = False) -> list[dict]:
    """The messages as [{"role", "content"}] (other keys dropped), or UserError naming `where` and the fault."""
    fault = message_fault(messages, prompt)
    if fault is not None:
        raise UserError(f"{where}: {fault}; fix the messages")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


class Conversation(NamedTuple):
    pos: Any  # read(pos) starts again at this row (what a resumed preparation records)
    where: str  # the file (or HF dataset) it came from
    row: int  # its row number there (jsonl: the line number), as errors name it
    messages: list  # validated: [{"role", "content"}]
    advance: int  # how far the progress bar moves (bytes for files, rows for HF datasets)


class RowAt(NamedTuple):
    """Where a row was read: what a row kind's `take` needs to make its item."""
    pos: Any
    where: str
    row: int
    advance: int


def take_conversation(value: Any, present: bool, at: RowAt, field: str) -> Iterator | Fault:
    """A rows source's chat row -> an iterator of one Conversation, or the row's Fault."""
    if not present:
        return Fault(f"it has no {field!r} field (set data.messages_field to the field holding the messages)",
                     NO_MESSAGES)
    fault = message_fault(value)
    if fault is not None:
        return fault
    messages = [{"role": m["role"], "content": m["content"]} for m in value]
    return iter([Conversation(at.pos, at.where, at.row, messages, at.advance)])


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
    from .sources import open_source  # sources.py picks the row kind from here: imported when used

    if getattr(cfg, "format", "text") != "chat":
        raise UserError("chat_rows needs data.format: chat")
    return ChatRows(open_source(cfg, spec, tail_split=False, key=key), skipped)
