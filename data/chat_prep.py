"""Preparing conversations (data.format: chat) through the prepare machinery that text uses: the same sources,
shards, manifest, checksums and resume after a kill (shards.py, build_writer.py).

A conversation travels through the writer as one document whose text is its messages as JSON (rows are
checked by data/messages.py as they are read), and is tokenized by `ChatWriterTokenizer`, which encodes
it with the chat template and stores each token as `2 * id + counted`: the loss mask rides in the token
stream's low bit, so a shard, its checksum and a resumed prepare cover ids and mask together with no second
file to keep in step. Conversations are joined by the tokenizer's eot (stored `2 * eot`), as documents are;
the loader (chat_loader.py) finds them by it. The manifest records {"chat": chat_record(tok)}.

Nothing here depends on the model's context: a conversation longer than it is cut (at a turn boundary) by
the loader, so one prepared dir serves every block_size.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from errors import UserError

from .chat_template import ChatTemplate, template_for

STORED = "2*id+counted"  # how a chat dir's tokens are stored (the manifest says it, the loader checks it)


def contents(text: str, sep: str = "") -> str:
    """The text of a carried conversation's contents, joined by `sep`: what a char vocabulary is scanned from
    and a BPE is trained on (never the JSON around them)."""
    return sep.join(m["content"] for m in json.loads(text))


class ChatWriterTokenizer:
    """What the shard writer tokenizes a chat source with: `tok`'s surface (name, chars, bpe), ids stored as
    2 * id + counted, eot stored 2 * eot (counted False), vocab_size the stored range."""

    def __init__(self, tok):
        self.tok = tok
        self.template = template_for(tok)
        self.name, self.chars, self.bpe = tok.name, tok.chars, tok.bpe
        self.eot = 2 * tok.eot
        self.vocab_size = 2 * self.template.vocab_size

    def encode_arrays(self, texts: list[str], num_threads: int = 1) -> list[np.ndarray]:
        out = []
        for text in texts:
            if not text:  # a progress-only piece (formats.py): no conversation
                out.append(np.zeros(0, dtype=np.int64))
                continue
            ids, mask = self.template.encode_conversation(self.tok, json.loads(text))
            out.append(np.asarray(ids, dtype=np.int64) * 2 + np.asarray(mask, dtype=np.int64))
        return out


def chat_record(tok) -> dict:
    """The manifest's "chat" entry: the template (its ids), the model vocabulary it needs, the storage."""
    template = template_for(tok)
    return {"template": template.to_dict(), "vocab_size": template.vocab_size, "stored": STORED}


def chat_of_meta(meta: dict, where: str) -> ChatTemplate | None:
    """The template of a prepared chat dir's manifest, None for a text dir; UserError for a damaged entry."""
    chat = meta.get("chat")
    if chat is None:
        return None
    if not isinstance(chat, dict) or chat.get("stored") != STORED:
        raise UserError(f"{where}'s chat entry is damaged or of another version; re-run `python -m data.prepare` "
                        "with the same settings to rebuild it")
    return ChatTemplate.from_dict(chat.get("template"))
