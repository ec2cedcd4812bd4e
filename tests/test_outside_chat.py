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


# what may follow a command's name on its line: anything but a line end, not whitespace alone
ARGUMENT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="\n\r\x0b\x0c\x1c\x1d"
                                 "\x1e\x85\u2028\u2029"), min_size=1, max_size=20).filter(lambda a: a.strip())


@settings(max_examples=10)
@given(arg=ARGUMENT)
def test_class_clear_refuses_what_follows_it_and_quit_quits_whatever_follows(chat_ckpt, capsys, monkeypatch, arg):
    """'/clear all' was done as if alone, the words after it dropped unsaid: one line naming /clear, and the chat goes
    on (the next message is answered). '/quit now' quits: whatever follows, the user asked to stop."""
    stdin = f"/clear {arg}\nhi\n/quit {arg}\nhi\n".encode("utf-8", "surrogatepass")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code, out, err = cli(["--checkpoint", str(chat_ckpt), "--device", "cpu", "--dtype", "float32",
                          "--max-new-tokens", "2"], capsys, main=chat_cli.main)
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 0 and len(errors) == 1 and "line 1 of stdin: /clear takes nothing after it" in errors[0], err
    assert out.count("\n") == 1, out  # the reply to the first "hi" (a command writes no line), none to the second
