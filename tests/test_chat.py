"""chat.py for real: a subprocess with piped stdin (the scripting format, greedy replies against an uncached
argmax loop written here), every bad input as one line, and a session under a pseudo-terminal where Ctrl-C
stops a reply and the chat goes on."""
from __future__ import annotations

import dataclasses
import fcntl
import io
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import torch

from chat_models import char_tok, layout, save_chat_checkpoint, tiny_chat_model
from data.chat_template import template_for
import warm_runs

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TOK = char_tok()
TEMPLATE = template_for(TOK)


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    model = tiny_chat_model(block_size=96, end_bias=5.0)
    return save_chat_checkpoint(tmp_path_factory.mktemp("chat") / "ckpt.pt", model), model


def chat(args, stdin: bytes, timeout=120) -> subprocess.CompletedProcess:
    return warm_runs.run([ROOT / "chat.py", *args], input=stdin, cwd=ROOT, timeout=timeout, env=ENV, text=False)


def reference_replies(model, messages: list[str], max_new: int, system: str | None = None) -> list[str]:
    """Greedy, one uncached forward per token over the whole conversation, until a marker or EOT."""
    convo = [{"role": "system", "content": system}] if system else []
    replies = []
    for text in messages:
        convo.append({"role": "user", "content": text})
        ids = layout(TEMPLATE, TOK, convo)  # (encode_prompt refuses the empty replies a random model writes)
        out = []
        with torch.no_grad():
            while len(out) < max_new:
                t = int(model(torch.tensor([ids + out]))[0, -1, :TEMPLATE.vocab_size].argmax())
                if t >= TEMPLATE.base or t == TOK.eot:
                    break
                out.append(t)
        replies.append(TOK.decode(out))
        convo.append({"role": "assistant", "content": replies[-1]})
    return replies


def unescape(line: str) -> str:
    """chat.py's piped format undone, written here: \\\\ -> \\, \\n -> newline, \\r -> carriage return."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\":
            out.append({"\\": "\\", "n": "\n", "r": "\r"}[line[i + 1]])
            i += 2
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def test_piped_stdin_gives_one_greedy_reply_line_per_message(chat_ckpt):
    path, model = chat_ckpt
    messages = ["hello", "what is 2+3?", "and 4+4?", "thanks, bye"]
    r = chat(["--checkpoint", path, "--max-new-tokens", 12, "--system", "be brief"],
             ("\n".join(messages[:2]) + "\n\n" + "\n".join(messages[2:]) + "\n").encode())
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.decode().split("\n")
    assert lines[-1] == "" and len(lines) == len(messages) + 1  # the blank line was skipped
    assert [unescape(x) for x in lines[:-1]] == reference_replies(model, messages, 12, "be brief")
    assert any(lines[:-1]), "the test model should say something"
    assert "temperature 0" in r.stderr.decode() and b"Traceback" not in r.stderr


def test_the_piped_format_escapes_backslashes_and_line_ends():
    from inference.chat_terminal import escape  # the piped format's helper, against hand-written lines

    assert escape("a\\b\nc\r\n") == "a\\\\b\\nc\\r\\n"
    assert unescape(escape("x\\n\n")) == "x\\n\n"


def test_commands_and_bad_lines_are_one_line_each_and_the_chat_goes_on(chat_ckpt):
    path, model = chat_ckpt
    stdin = b"\n".join([
        b"/temperature warm", b"/temperature -1", b"/bogus", b"/system be brief",  # commands: stderr only
        b"hi \xff there",  # not UTF-8
        b"z" * 300,  # longer than the context
        b"caf\xc3\xa9",  # a character the char vocabulary lacks
        b"x" * (2**20 + 10),  # past the line limit
        b"hello", b"/clear", b"hello", b"/quit", b"never read",
    ]) + b"\n"
    r = chat(["--checkpoint", path, "--max-new-tokens", 8], stdin)
    err = r.stderr.decode().splitlines()
    assert r.returncode == 0 and not any("Traceback" in e for e in err), r.stderr.decode()
    errors = [e for e in err if e.startswith("error:")]
    assert len(errors) == 7
    for words, line in zip([("/temperature", "number"), ("/temperature", ">= 0"), ("unknown command", "/clear"),
                            ("line 5", "UTF-8"), ("line 6", "shorten it"), ("line 7", "char vocabulary"),
                            ("line 8", "MiB")], errors):
        assert all(w in line for w in words), (words, line)
    out = r.stdout.decode().split("\n")
    ref = reference_replies(model, ["hello"], 8, "be brief")[0]
    assert [unescape(x) for x in out] == ["", "", "", "", ref, ref, ""]  # 4 refused messages, 2 replies


def run_in_process(args, stdin: bytes, capsys, monkeypatch):
    """chat.py's main (inference/chat_cli.py) through run_cli, in this process (no start-up cost) -> (exit code,
    stdout, stderr)."""
    sys.path.insert(0, str(ROOT))
    from inference import chat_cli
    from errors import run_cli

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    with pytest.raises(SystemExit) as exc:
        run_cli(lambda: chat_cli.main([str(a) for a in args]))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.mark.parametrize("case", ["missing", "damaged", "not_chat", "bad_template", "top_k", "temperature", "unknown"])
def test_bad_checkpoints_and_options_are_one_line(chat_ckpt, tmp_path, case, capsys, monkeypatch):
    path, model = chat_ckpt
    args = ["--checkpoint", tmp_path / "ckpt.pt"]  # "missing": never written
    if case == "damaged":
        (tmp_path / "ckpt.pt").write_bytes(path.read_bytes()[:5000])
    elif case in ("not_chat", "bad_template"):
        from checkpoint import load_checkpoint, save_checkpoint

        ckpt = load_checkpoint(path)
        if case == "not_chat":
            del ckpt["chat_template"]
        else:
            ckpt["chat_template"] = {"name": "smallgpt-chat-v1", "markers": {"<|system|>": 3}}
        save_checkpoint(tmp_path / "ckpt.pt", ckpt)
    elif case != "missing":
        args = ["--checkpoint", path] + {"top_k": ["--top-k", 0], "temperature": ["--temperature", "nan"],
                                         "unknown": ["--bogus"]}[case]
    code, out, err = run_in_process(args, b"hi\n", capsys, monkeypatch)
    err = err.strip().splitlines()
    assert code == 2 and out == "", err
    assert len(err) == 1 and err[0].startswith("error:"), err
    if case == "not_chat":
        assert "not a chat model" in err[0] and "sft.yaml" in err[0]


def test_in_process_piped_greedy_replies_equal_the_reference(chat_ckpt, capsys, monkeypatch):
    path, model = chat_ckpt
    code, out, err = run_in_process(["--checkpoint", path, "--max-new-tokens", 6], b"hi\nok\n", capsys, monkeypatch)
    assert code == 0, err
    assert [unescape(x) for x in out.split("\n")[:-1]] == reference_replies(model, ["hi", "ok"], 6)


# ------------------------------------------------------------------------------ at a terminal

class Terminal:
    """chat.py on a pseudo-terminal that is its controlling terminal, so that writing ^C to it is Ctrl-C."""

    def __init__(self, args):
        master, slave = pty.openpty()

        def own_terminal():  # in the child, after setsid: the pty becomes its controlling terminal
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen([sys.executable, str(ROOT / "chat.py"), *map(str, args)], stdin=slave,
                                     stdout=slave, stderr=slave, cwd=ROOT, env=ENV, start_new_session=True,
                                     preexec_fn=own_terminal)
        os.close(slave)
        self.master, self.seen, self.pos = master, b"", 0

    def read_until(self, pattern: bytes, timeout: float = 90.0) -> None:
        """Read until `pattern` appears after the last pattern found."""
        start = self.pos
        deadline = time.monotonic() + timeout
        while (at := self.seen.find(pattern, start)) < 0:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None and not select.select([self.master], [], [], 0)[0]:
                raise AssertionError(f"no {pattern!r} in {self.seen[-2000:]!r}")
            if select.select([self.master], [], [], min(left, 1.0))[0]:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # the child closed the terminal
                    pass
        self.pos = at + len(pattern)

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> int:
        """The exit status, once chat.py has ended by itself (killed after 60 s). What it writes meanwhile is
        read (a terminal whose buffer fills blocks its writer) and kept, for the failure's message."""
        deadline = time.monotonic() + 60
        try:
            while self.proc.poll() is None:
                if time.monotonic() > deadline:
                    raise AssertionError(f"chat.py did not end within 60 s; it wrote: {self.seen[-2000:]!r}")
                if select.select([self.master], [], [], 0.2)[0]:
                    try:
                        self.seen += os.read(self.master, 65536)
                    except OSError:  # the child closed the terminal
                        pass
            return self.proc.returncode
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.master is not None:
            os.close(self.master)
            self.master = None


def test_ctrl_c_at_a_terminal_stops_the_reply_not_the_chat(tmp_path):
    # a reply of 'a's that would run until the context (1024) is full: seconds, so Ctrl-C lands inside it
    model = tiny_chat_model(block_size=1024, favour="a", n_embd=128, n_layer=4)
    path = save_chat_checkpoint(tmp_path / "ckpt.pt", model)
    term = Terminal(["--checkpoint", path, "--temperature", "0", "--max-new-tokens", 100000])
    try:
        term.read_until(b"you> ")
        term.send(b"tell me a story\n")
        term.read_until(b"bot> ")
        term.read_until(b"aaaa")
        term.send(b"\x03")
        term.read_until(b"reply stopped")
        term.read_until(b"you> ")
        term.send(b"/temperature 0.5\n")
        term.read_until(b"temperature 0.5")
        term.send(b"and another\n")
        term.read_until(b"bot> ")
        term.read_until(b"aaaa")
        term.send(b"\x03")
        term.read_until(b"you> ")
        term.send(b"\x03")  # at the prompt: quits
        code = term.close()
    finally:
        term.kill()
    text = term.seen.decode(errors="replace")
    assert code == 0, text[-2000:]
    assert "Traceback" not in text and "interrupted" not in text
    assert text.count("reply stopped") == 2


def test_end_of_input_at_the_prompt_quits_cleanly(chat_ckpt):
    path, _ = chat_ckpt
    term = Terminal(["--checkpoint", path, "--max-new-tokens", 5])
    try:
        term.read_until(b"you> ")
        term.send(b"hi\n")
        term.read_until(b"bot> ")
        term.read_until(b"you> ")
        term.send(b"\x04")  # Ctrl-D
        code = term.close()
    finally:
        term.kill()
    assert code == 0 and b"Traceback" not in term.seen


def test_loading_gives_a_chat_checkpoints_template_and_none_for_a_plain_one(chat_ckpt, tmp_path):
    from checkpoint import load_checkpoint, load_for_inference, save_checkpoint
    from errors import UserError
    from model import GPT, GPTConfig

    path, model = chat_ckpt
    loaded = load_for_inference(str(path))
    assert loaded.chat_template == TEMPLATE and loaded.chat_template.base == len(TOK.chars) + 1
    assert loaded.tok.vocab_size == TOK.vocab_size and not loaded.model.training
    assert load_for_inference(str(save_chat_checkpoint(tmp_path / "plain.pt", model, chat=False))).chat_template is None
    small = GPT(GPTConfig(vocab_size=TOK.vocab_size + 2, block_size=16, n_layer=1, n_head=1, n_embd=8))
    ckpt = load_checkpoint(path)  # a template whose markers the model has no rows for
    ckpt.update(model=small.state_dict(), model_config=dataclasses.asdict(small.config))
    save_checkpoint(tmp_path / "short.pt", ckpt)
    with pytest.raises(UserError, match="rows"):
        load_for_inference(str(tmp_path / "short.pt"))
