"""What fine-tuning on conversations (data.format chat, configs/sft.yaml) adds to a training run: the model's
vocabulary grown to hold the template's markers, and the showcase's chat prompts and their display.

    vocab = chat_vocab_size(meta)                  # 0 for documents; else base + 4 (the template's)
    note = grow_vocab(model, vocab, seed)          # new rows: the mean of the existing ones, plus a little noise
"""
from __future__ import annotations

from typing import Any, Sequence

from data.chat_template import MARKERS, ChatTemplate, template_for
from errors import UserError
from model.vocab import grow_vocab

__all__ = ["chat_vocab_size", "data_notes", "grow_vocab", "chat_prompts", "MarkedTokenizer", "DEFAULT_QUESTIONS"]

DEFAULT_QUESTIONS = ["What is 12 + 7?", "Reverse the word: hello"]  # the showcase's chat prompts by default


def chat_vocab_size(meta: dict) -> int:
    """The model vocabulary a prepared dir needs for its chat markers (0: documents, nothing needed)."""
    chat = meta.get("chat")
    return int(chat["vocab_size"]) if isinstance(chat, dict) else 0


def data_notes(trainer, block_size: int) -> list[str]:
    """What the run says of its conversations: how many were cut or dropped to fit the context, per split."""
    loaders = {"train": trainer.train_loader, **{f"eval {k}": v for k, v in trainer.eval_loaders.items()}}
    return [loader.index.note(name, block_size) for name, loader in loaders.items()
            if hasattr(loader, "index") and name != "eval train"]


def chat_prompts(tok, template: ChatTemplate, questions: Sequence[str], given: bool) -> list[tuple[str, list[int]]]:
    """(question, prompt ids ending with <|assistant|>) for each question; one the tokenizer can't encode is one
    line when given (eval.sample_prompts), left out when it is a default."""
    out = []
    for i, q in enumerate(questions, 1):
        try:
            out.append((q, template.encode_prompt(tok, [{"role": "user", "content": q}])))
        except UserError as e:
            if given:
                raise UserError(f"eval.sample_prompts: question {i} ({q[:40]!r}) cannot be a chat prompt for the "
                                f"{tok.name} tokenizer: {e}") from None
    return out


class MarkedTokenizer:
    """A tokenizer's surface over the chat vocabulary: markers decode to their names (the inspection's labels)."""

    def __init__(self, tok, template: ChatTemplate | None = None):
        self.tok, self.template = tok, template or template_for(tok)
        self.name, self.eot, self.chars = tok.name, tok.eot, tok.chars
        self.vocab_size = self.template.vocab_size

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        base = self.template.base
        return "".join(MARKERS[i - base] if i >= base else self.tok.decode([i]) for i in ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)
