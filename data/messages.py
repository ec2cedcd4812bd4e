"""Checking a conversation's messages: the faults a row (or a prompt) can have, each one line, and the kind a
skipped row is counted under; and what a rows source makes of a good chat row: one document whose text is
its messages as compact JSON (what the prepare carries and data/chat_prep.py tokenizes). The API that reads
chat sources is data/conversations.py, which re-exports these names."""
from __future__ import annotations

import json
import re
from typing import Any, Iterator

from errors import UserError

from .pieces import CHUNK_CHARS, Piece

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
TOO_LONG = "conversation too long"
UNREADABLE = "unreadable row"  # not JSON, not UTF-8, not an object: what formats.py says of any row

# A fault's kind, read back from its text: skipped rows are recorded as text (in the resume record and the
# manifest), so the count per kind after a resumed prepare comes from the text. Each pattern is anchored on
# the fixed words before any value taken from the row (a role is quoted after "has role").
KINDS = [(k, re.compile(p)) for k, p in (
    (NO_MESSAGES, r"it has no '.*' field \(set data\.messages_field"),
    (NOT_A_LIST, r"its messages are (null|a \w+), not a list"),
    (NOT_AN_OBJECT, r"message \d+ is a \w+, not an object"),
    (NO_ROLE_OR_CONTENT, r"message \d+ has no '(role|content)'$"),
    (UNKNOWN_ROLE, r"message \d+ has role "),
    (NOT_TEXT, r"message \d+ \(\w+\) has ((null|a \w+) as content, not text$|a lone surrogate )"),
    (EMPTY, r"message \d+ \(\w+\) has empty content$"),
    (SYSTEM_NOT_FIRST, r"message \d+ is a system turn;"),
    (NOT_ALTERNATING, r"message \d+ is an? (user|assistant) turn |its last message \(\d+\) is a user turn|"
                      r"it does not end with a user turn"),
    (NO_ASSISTANT, r"it has no (assistant turn|messages)$"),
    (TOO_LONG, r"its conversation is over [\d,]+ characters"),
)]


def lone_surrogate(text: str) -> str | None:
    """Where `text` holds a lone surrogate, in words ("\\ud800 at character 4"); None for text. JSON's "\\ud800"
    escape is valid JSON but no text: the char and BPE tokenizers fail on it, and GPT-2's replaces it with U+FFFD."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"\\u{ord(text[e.start]):04x} at character {e.start}"
    return None


def fault_kind(why: str) -> str:
    """The kind a bad row's fault is counted under (UNREADABLE for the faults of any row: broken JSON, ...)."""
    return next((kind for kind, pattern in KINDS if pattern.match(why)), UNREADABLE)


def message_fault(messages: Any, prompt: bool = False) -> str | None:
    """What is wrong with `messages`, or None. A conversation is [system] (user assistant)+; a prompt
    (prompt=True) is [system] (user assistant)* user. Keys other than role and content (OpenAI's "name",
    a dataset's ids) are ignored: they do not change the text the model sees."""
    if not isinstance(messages, (list, tuple)):
        what = "null" if messages is None else f"a {type(messages).__name__}"
        return f"its messages are {what}, not a list of {{\"role\", \"content\"}} objects"
    for k, m in enumerate(messages, 1):
        if not isinstance(m, dict):
            return f"message {k} is a {type(m).__name__}, not an object with role and content"
        missing = [key for key in ("role", "content") if key not in m]
        if missing:
            return f"message {k} has no {missing[0]!r}"
        role, content = m["role"], m["content"]
        if role not in ROLES:
            return f"message {k} has role {str(role)[:40]!r}; the roles are system, user and assistant"
        if not isinstance(content, str):
            what = "null" if content is None else f"a {type(content).__name__}"
            return f"message {k} ({role}) has {what} as content, not text"
        if not content.strip():
            return f"message {k} ({role}) has empty content"
        at = lone_surrogate(content)
        if at:
            return (f"message {k} ({role}) has a lone surrogate ({at}) in its content, not text; write the character "
                    "itself or a surrogate pair")
    turns = list(messages)
    if turns and turns[0]["role"] == "system":
        turns = turns[1:]
    offset = len(messages) - len(turns)
    for k, m in enumerate(turns):
        if m["role"] == "system":
            return f"message {k + offset + 1} is a system turn; only the first message may be"
        want = ("user", "assistant")[k % 2]
        if m["role"] != want:
            after = f"after {_a(turns[k - 1]['role'])} turn" if k else "first (after an optional system turn)"
            return (f"message {k + offset + 1} is {_a(m['role'])} turn {after}; turns alternate user, assistant, "
                    f"user, ...")
    if prompt:
        if not turns or turns[-1]["role"] != "user":
            return "it does not end with a user turn to reply to"
        return None
    if not any(m["role"] == "assistant" for m in turns):
        return "it has no assistant turn" if messages else "it has no messages"
    if turns[-1]["role"] != "assistant":
        return f"its last message ({len(messages)}) is a user turn with no reply"
    return None


def _a(role: str) -> str:
    return f"an {role}" if role == "assistant" else f"a {role}"


def check_messages(messages: Any, where: str, prompt: bool = False) -> list[dict]:
    """The messages as [{"role", "content"}] (other keys dropped), or UserError naming `where` and the fault."""
    fault = message_fault(messages, prompt)
    if fault is not None:
        raise UserError(f"{where}: {fault}; fix the messages")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def conversation_text(messages: list[dict]) -> str:
    """A checked conversation as the document the prepare carries (compact JSON, role and content only)."""
    return json.dumps([{"role": m["role"], "content": m["content"]} for m in messages], ensure_ascii=False,
                      separators=(",", ":"))


def take_conversation(value: Any, present: bool, pos: Any, advance: int, field: str) -> Iterator[Piece] | str:
    """A rows source's chat row -> its one document piece, or the row's fault."""
    if not present:
        return f"it has no {field!r} field (set data.messages_field to the field holding the messages)"
    fault = message_fault(value)
    if fault is not None:
        return fault
    text = conversation_text(value)
    if len(text) > CHUNK_CHARS:  # longer documents are cut into pieces; a conversation travels whole
        return f"its conversation is over {CHUNK_CHARS:,} characters; split it into shorter conversations"
    return iter([Piece(True, text, advance, pos, None)])
