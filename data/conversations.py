"""Stand-in for chatdata's row validation (replaced by their data/conversations.py on merge): the shape of
a conversation, checked, with a one-line error naming where it came from."""
from __future__ import annotations

from typing import Any

from errors import UserError

ROLES = ("system", "user", "assistant")


def check_messages(messages: Any, where: str, prompt: bool = False) -> list[dict]:
    """`messages` as a list of {"role", "content"} dicts: system (optional) first, then user and assistant
    alternating from user; ending with an assistant turn (prompt: a user turn). UserError names `where`."""
    def bad(why: str) -> UserError:
        return UserError(f"{where}: {why}; fix the conversation")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad(f"message {i + 1} has an unknown role {m.get('role') if isinstance(m, dict) else m!r:.40}")
        if not isinstance(m.get("content"), str) or not m["content"]:
            raise bad(f"message {i + 1} has an empty or non-string content")
        out.append({"role": m["role"], "content": m["content"]})
    turns = out[1:] if out[0]["role"] == "system" else out
    for i, m in enumerate(turns):
        if m["role"] != ("user", "assistant")[i % 2]:
            raise bad("system is not first" if m["role"] == "system" else "turns do not alternate user, assistant")
    if not turns or turns[-1]["role"] != ("user" if prompt else "assistant"):
        raise bad("the prompt must end with a user turn" if prompt else "it has no closing assistant turn")
    return out
