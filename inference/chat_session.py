"""One conversation with a chat model: its messages, its token ids and its KV cache (model/generate.py's
CachedSequence), kept across turns so that a new user turn prefills only its own tokens.

    session = ChatSession(model, tok, template, sampling=Sampling(temperature=0))
    for piece in session.reply("What is 2+2?"):   # text pieces as they are generated
        print(piece, end="", flush=True)
    session.messages    # [{"role": "user", ...}, {"role": "assistant", "content": "4"}]

Layout (the chat template's, data/chat_template.py): [<|system|> s <|end|>] (<|user|> u <|end|> <|assistant|>
a <|end|>)+. Each message's ids are built once from the template's marker ids and the tokenizer, and an
assistant turn keeps the ids the model generated (re-encoding its text could split it otherwise), so the
ids are always the conversation's, token for token.

A reply ends at <|end|> (or at any other marker, or the tokenizer's end-of-text: a reply holds none of
them), after `max_new_tokens`, or when the caller stops it (closing the generator, e.g. on Ctrl-C); in
every case the turn is closed with <|end|> and the reply so far is the assistant's message.

The context (block_size) never overflows: before a user turn the oldest exchanges (a user turn and its
reply) are dropped until the new turn and `reply_room` tokens fit; the system message always stays. A
reply that fills the context drops older exchanges too, and is cut when none is left. Dropping rebuilds
the cache (the positions change) and says so through `notice`.

The tokenizer and the template come in as objects (tok.encode, tok.decode, tok.eot; template.id(marker),
template.end, template.vocab_size, template.base): data/chat_template.py's, loaded with the checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from data.chat_template import ROLE_MARKER
from errors import UserError
from model.generate import CachedSequence, sample
from runtime.sampling import Sampling
from runtime.text import TextStream

@dataclass
class Turn:
    role: str
    content: str
    ids: list[int]  # the turn's ids in the layout, markers included


class ChatSession:
    def __init__(self, model, tok, template, *, sampling: Sampling | None = None, system: str | None = None,
                 max_new_tokens: int = 512, reply_room: int | None = None, decode_fn=None, seed: int = 0,
                 notice: Callable[[str], None] = lambda msg: None):
        self.model, self.tok, self.template = model, tok, template
        self.sampling = sampling or Sampling()
        self.max_new_tokens = max_new_tokens
        self.block_size = model.config.block_size
        # room kept for the reply when a user turn comes in: a quarter of the context at most, so that a
        # long conversation keeps most of its history
        self.reply_room = reply_room if reply_room is not None else max(1, min(max_new_tokens, self.block_size // 4))
        device = model.transformer.wte.weight.device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.notice = notice
        self.seq = CachedSequence(model, decode_fn)
        # a reply never holds a marker or end-of-text: the model writing one has finished its turn
        self.stops = template.stop_ids(tok)
        self.turns: list[Turn] = []
        if system:
            self.set_system(system)

    # ------------------------------------------------------------------------------ the conversation

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": t.role, "content": t.content} for t in self.turns]

    def turn_ids(self, role: str, content: str) -> list[int]:
        """<|role|> content <|end|>; UserError where the tokenizer cannot encode the text (a char vocabulary)."""
        return [self.template.id(ROLE_MARKER[role]), *self.tok.encode(content), self.template.end]

    def set_system(self, text: str) -> None:
        """Replace (or add, or with "" remove) the system message; the turns after it stay. The cache is
        rebuilt at the next turn (everything after the system message moves)."""
        ids = self.turn_ids("system", text) if text else []
        if len(ids) + self.reply_room + 3 > self.block_size:  # 3: the least a user turn takes
            raise UserError(f"the system message is {len(ids)} tokens; with room for a turn and a reply it must stay "
                            f"under {self.block_size - self.reply_room - 3} (the context is {self.block_size}); "
                            "shorten it")
        rest = [t for t in self.turns if t.role != "system"]
        self.turns = ([Turn("system", text, ids)] if text else []) + rest
        self._rebuild()

    def clear(self) -> None:
        """Forget every turn but the system message."""
        self.turns = [t for t in self.turns if t.role == "system"]
        self._rebuild()

    def _rebuild(self) -> None:
        """The cache anew from the turns, the oldest exchanges dropped (and said) while they outgrow the context: a
        reply cut at the context's end closes its turn past it (its last token and <|end|>), and /system after it
        asserted in seq.reset."""
        dropped = 0
        while self._length() > self.block_size and self._drop_oldest_exchange():
            dropped += 1
        if dropped:
            self._say_dropped(dropped)
        self.seq.reset([i for t in self.turns for i in t.ids])

    def _drop_oldest_exchange(self, keep_last: int = 0) -> bool:
        """Drop the oldest user turn and its reply (never the system message, nor the last `keep_last`
        turns); False when there is none to drop."""
        first = 1 if self.turns and self.turns[0].role == "system" else 0
        droppable = len(self.turns) - keep_last - first
        if droppable < 1:
            return False
        n = 2 if droppable >= 2 and self.turns[first + 1].role == "assistant" else 1
        del self.turns[first:first + n]
        return True

    # ------------------------------------------------------------------------------ a turn

    def reply(self, text: str) -> Iterator[str]:
        """Add the user's message, then yield the reply as text pieces while it is generated. A message
        that cannot be encoded or cannot fit is a UserError before anything changes."""
        user = Turn("user", text, self.turn_ids("user", text))
        needed = len(user.ids) + 1 + self.reply_room  # + <|assistant|>
        base = len(self.turns[0].ids) if self.turns and self.turns[0].role == "system" else 0
        if base + needed > self.block_size:
            raise UserError(f"the message is {len(user.ids) - 2} tokens; with room for a reply it must stay under "
                            f"{self.block_size - base - self.reply_room - 3} (the context is {self.block_size} "
                            f"tokens{', the system message takes ' + str(base) if base else ''}); shorten it")
        return self._reply(user)

    def _reply(self, user: Turn) -> Iterator[str]:
        dropped = 0
        while self._length() + len(user.ids) + 1 + self.reply_room > self.block_size and self._drop_oldest_exchange():
            dropped += 1
        if dropped or self._length() != len(self.seq.ids):  # a cut reply left its <|end|> out of the cache
            self._rebuild()
        if dropped:
            self._say_dropped(dropped)
        self.turns.append(user)
        self.seq.append(user.ids)
        assistant = Turn("assistant", "", [self.template.id("<|assistant|>")])
        self.turns.append(assistant)
        self.seq.append(assistant.ids)
        stream = TextStream(self.tok.decode)
        generated: list[int] = []
        s = self.sampling
        try:
            for _ in range(self.max_new_tokens):
                logits = self.seq.logits()[:, :self.template.vocab_size]  # ids above the markers: padding
                token = int(sample(logits, s.temperature, s.top_k, s.top_p, self.generator)[0])
                if token in self.stops:
                    break
                generated.append(token)
                # the token joins the cache before it is shown (a reply stopped at a yield keeps it there too);
                # full, with nothing to drop, it is the last: the full context's logits gave it, as serve.py's
                if self.seq.room:
                    self.seq.append([token])
                    last = False
                else:
                    last = not self._make_room(assistant.ids + generated)  # rebuilt with it, or nothing to drop
                piece = stream.add(token)
                if piece:
                    yield piece
                if last:
                    self.notice(f"the reply filled the context ({self.block_size} tokens): it is cut here")
                    break
            tail = stream.finish()
            if tail:
                yield tail
        finally:  # also when the caller stops the reply (Ctrl-C): the turn is closed with what was said
            assistant.ids += generated + [self.template.end]
            assistant.content = self.tok.decode(generated)
            if self.seq.room > 0:
                self.seq.append([self.template.end])
            # else (a reply cut at the context's end) the cache holds fewer ids than the turns: the next turn, /system
            # or /clear drops the oldest exchanges that no longer fit and rebuilds (_rebuild)

    def _length(self) -> int:
        return sum(len(t.ids) for t in self.turns)

    def _make_room(self, current: list[int]) -> bool:
        """The reply reached block_size: drop the oldest exchange before this one and rebuild the cache
        with the reply so far (`current`). False when only the system message and this exchange are left."""
        if not self._drop_oldest_exchange(keep_last=2):
            return False
        self.seq.reset([i for t in self.turns[:-1] for i in t.ids] + current)
        self._say_dropped(1)
        return True

    def _say_dropped(self, n: int) -> None:
        kept = " (the system message is kept)" if self.turns and self.turns[0].role == "system" else ""
        self.notice(f"the context ({self.block_size} tokens) is full: dropped the oldest {n} exchange"
                    f"{'s' * (n > 1)}{kept}")
