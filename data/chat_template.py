"""STAND-IN (branch chatcli) for the chat template owned by branch chatdata, coded to the shared interface
(CHAT_INTERFACE.md) so that loading and chat.py can be built and tested before it lands; chatdata's file
replaces this one at the merge.

Layout: [<|system|> content <|end|>] (<|user|> content <|end|> <|assistant|> content <|end|>)+; the
markers take the ids base+0..base+3 right above the tokenizer's vocabulary."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from errors import UserError

MARKERS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
NAME = "smallgpt-chat-v1"
ROLE_MARKER = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    base: int

    def id(self, marker: str) -> int:
        return self.base + MARKERS.index(marker)

    @property
    def end(self) -> int:
        return self.id("<|end|>")

    @property
    def vocab_size(self) -> int:
        return self.base + len(MARKERS)

    def encode_conversation(self, tok, messages) -> tuple[list[int], list[bool]]:
        ids: list[int] = []
        mask: list[bool] = []
        for m in messages:
            content = tok.encode(m["content"])
            train = m["role"] == "assistant"
            ids += [self.id(ROLE_MARKER[m["role"]]), *content, self.end]
            mask += [False] + [train] * len(content) + [train]
        return ids, mask

    def encode_prompt(self, tok, messages, add_generation_prompt: bool = True) -> list[int]:
        ids = self.encode_conversation(tok, messages)[0]
        return ids + [self.id("<|assistant|>")] if add_generation_prompt else ids

    def decode(self, tok, ids) -> str:
        return tok.decode([i for i in ids if not self.base <= i < self.vocab_size])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "markers": {m: self.id(m) for m in MARKERS}}

    @classmethod
    def from_dict(cls, d) -> "ChatTemplate":
        try:
            ids = [d["markers"][m] for m in MARKERS]
            name = d["name"]
        except (TypeError, KeyError) as e:
            raise UserError(f"the checkpoint's chat_template entry is damaged (no {e}); re-run the fine-tuning "
                            "(sft.yaml)") from None
        if not (isinstance(name, str) and all(type(i) is int for i in ids) and ids[0] >= 0
                and ids == list(range(ids[0], ids[0] + len(MARKERS)))):
            raise UserError("the checkpoint's chat_template entry is damaged (its marker ids are not consecutive "
                            "integers); re-run the fine-tuning (sft.yaml)")
        return cls(name, ids[0])


def template_for(tok) -> ChatTemplate:
    return ChatTemplate(NAME, tok.vocab_size)
