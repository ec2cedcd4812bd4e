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
from data.chat_template import MARKERS, ChatTemplate
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
