"""chat.py's inputs found from outside: a --system the model cannot take was refused in a line that did not
name --system, which with messages piped in reads as the error of a message."""
from __future__ import annotations

import io
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat_models import CHARS, save_chat_checkpoint, tiny_chat_model
from cli_lines import cli, one_error_line
from inference import chat_cli

IN_VOCAB = st.text(st.sampled_from(CHARS.replace("\n", "")), max_size=8)
# printable characters the char vocabulary lacks (a lone surrogate is --system's UTF-8 check, tested apart)
LACKED = st.characters(codec="utf-8", exclude_categories=["Cs", "Cc", "Zs", "Zl", "Zp"], exclude_characters=CHARS)


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    return save_chat_checkpoint(tmp_path_factory.mktemp("chat") / "ckpt.pt", tiny_chat_model(block_size=64))


@st.composite
def unusable_system(draw) -> str:
    """A system message the model cannot take: a character its vocabulary lacks, or longer than its context."""
    if draw(st.booleans()):
        return draw(IN_VOCAB) + draw(LACKED) + draw(IN_VOCAB)
    return "a" + draw(IN_VOCAB) + "b" * draw(st.integers(64, 200))


@settings(max_examples=8)
@given(system=unusable_system())
def test_class_a_system_message_the_model_cannot_take_is_named_as_system(chat_ckpt, capsys, monkeypatch, system):
    """'--system é' said only "1 character(s) not in the char vocabulary": with messages piped in, the line of a
    refused message; it names --system, and no message is answered."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hi\n")))
    code, out, err = cli(["--checkpoint", str(chat_ckpt), "--device", "cpu", "--dtype", "float32", "--system", system],
                         capsys, main=chat_cli.main)
    notes = [ln for ln in err.splitlines() if ln.startswith("chat.py: ")]  # (the model loaded: no error)
    line = one_error_line(code, "\n".join(ln for ln in err.splitlines() if ln not in notes))
    assert line.startswith("error: --system: "), line
    assert out == "", out
