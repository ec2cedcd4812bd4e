"""Checking a conversation's messages: the faults a row (or a prompt) can have, each in one line with the kind
it is counted under when skipped; and what a rows source makes of a chat row (a Conversation). The API that
reads chat sources is data/conversations.py, which re-exports these names."""
from __future__ import annotations

from typing import Any, Iterator, NamedTuple

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
        what = "null" if messages is None else f"a {type(messages).__name__}"
        return Fault(f"its messages are {what}, not a list of "
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
