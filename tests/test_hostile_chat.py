"""Hostile inputs to the chat side, found from outside (chat.py, data.prepare --format chat, damaged
checkpoints): each class is one line naming the problem and the fix, never a traceback."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from checkpoint import load_for_inference, save_checkpoint
from chat_models import CHARS, char_tok, save_chat_checkpoint, tiny_chat_model
from data import DataConfig
from data.chat_template import MARKERS, ChatTemplate
from data.conversations import NOT_TEXT, chat_rows, fault_kind
from errors import UserError
from model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
TOK = char_tok()
BASE = TOK.vocab_size

ODD_KEYS = st.one_of(st.integers(), st.none(), st.booleans(), st.floats(allow_nan=False), st.tuples(st.text(max_size=3)),
                     st.binary(max_size=3), st.text(max_size=12))


@given(keep=st.lists(st.sampled_from(MARKERS), unique=True), odd=st.lists(ODD_KEYS, min_size=1, max_size=3))
def test_class_chat_template_marker_keys_of_any_type_are_one_line(keep, odd):
    # a checkpoint's markers mapping with keys of mixed types: sorted() of them was a TypeError traceback
    markers = {m: BASE + MARKERS.index(m) for m in keep}
    markers.update({k: BASE for k in odd})
    if set(markers) == set(MARKERS):
        return
    with pytest.raises(UserError, match="chat_template entry is damaged") as e:
        ChatTemplate.from_dict({"name": "smallgpt-chat-v1", "markers": markers})
    assert "\n" not in str(e.value)


@given(base=st.integers(1, BASE + 40).filter(lambda b: b != BASE))
def test_class_chat_template_base_other_than_the_tokenizers_is_refused(tmp_path_factory, base):
    # markers below the tokenizer's vocabulary are ids of text (a message could forge a turn, and decode
    # dropped every character at or above them); the model was loaded and chatted anyway
    config = GPTConfig(vocab_size=max(base, BASE) + 4, block_size=16, n_layer=1, n_head=1, n_embd=8)
    path = tmp_path_factory.mktemp("base") / "ckpt.pt"
    save_checkpoint(path, {"model": GPT(config).state_dict(), "model_config": dataclasses.asdict(config), "config": {},
                           "tokenizer": {"tokenizer": "char", "chars": CHARS}, "iter": 0,
                           "chat_template": ChatTemplate("smallgpt-chat-v1", base).to_dict()})
    with pytest.raises(UserError, match=f"puts <\\|system\\|> at id {base}, but .* {BASE} ids") as e:
        load_for_inference(str(path))
    assert "fine-tune again" in str(e.value) and "\n" not in str(e.value)


@given(n_turns=st.integers(1, 3), data=st.data())
def test_class_lone_surrogate_in_a_conversation_row_is_a_bad_row_counted_as_not_text(tmp_path_factory, n_turns, data):
    # {"content": "x\ud800"} is valid JSON; prepare with the char or a BPE tokenizer died in the tokenizer
    # (UnicodeEncodeError traceback) after the row had been accepted
    messages = [{"role": ("user", "assistant")[i % 2], "content": "ab"} for i in range(2 * n_turns)]
    hit = data.draw(st.integers(0, len(messages) - 1))
    code = data.draw(st.integers(0xD800, 0xDFFF))
    at = data.draw(st.integers(0, 2))
    content = "ab"[:at] + "@" + "ab"[at:]
    row = json.dumps({"messages": messages}).replace('"ab"', json.dumps(content), hit + 1).replace(
        json.dumps(content), '"ab"', hit).replace("@", f"\\u{code:04x}")
    path = tmp_path_factory.mktemp("rows") / "chats.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n" + row + "\n", encoding="utf-8")
    cfg = DataConfig(dataset=str(path), format="chat")
    with pytest.raises(UserError) as e:
        list(chat_rows(cfg).read())
    msg = str(e.value)
    assert msg.startswith(f"{path}, row 2: message {hit + 1} ") and f"\\u{code:04x}" in msg and "\n" not in msg, msg
    assert fault_kind(msg.split(", row 2: ")[1]) == NOT_TEXT
    skipped = chat_rows(dataclasses.replace(cfg, skip_bad_rows=True))
    assert len(list(skipped.read())) == 1 and skipped.skipped() == {NOT_TEXT: 1}
