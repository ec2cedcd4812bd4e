"""Hostile inputs to the chat side, found from outside (chat.py, data.prepare --format chat, damaged
checkpoints): each class is one line naming the problem and the fix, never a traceback."""
from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint import load_for_inference, save_checkpoint
from chat_models import CHARS, char_tok, save_chat_checkpoint, tiny_chat_model
from data import DataConfig
from data.chat_template import MARKERS, ChatTemplate
from data.conversations import NOT_TEXT, chat_rows, fault_kind
from data.sources import open_source
from errors import UserError
from model import GPT, GPTConfig
import warm_runs

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


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# every whitespace str.split() splits on that a terminal or a script can put after a command's name
SPACES = [c for c in map(chr, range(0x3000 + 1)) if c.isspace() and c not in "\n\r\x1c\x1d\x1e\x85\u2028\u2029"]


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    return save_chat_checkpoint(tmp_path_factory.mktemp("chat") / "ckpt.pt", tiny_chat_model(end_bias=5.0))


def chat(args, stdin: bytes) -> subprocess.CompletedProcess:
    return warm_runs.run([ROOT / "chat.py", "--device", "cpu", "--max-new-tokens", "4", *args], input=stdin, cwd=ROOT,
                         env=ENV, text=False)


def test_class_command_then_any_whitespace_is_that_command_and_bad_command_lines_write_no_reply_line(chat_ckpt):
    # "/clear\t" was "unknown command '/clear'; the commands are /clear, ..."; and a command line that is not
    # UTF-8 or over 1 MiB wrote an empty reply line, so stdout no longer had one line per message
    lines = [f"/temperature{s}0.5" for s in SPACES] + [f"/clear{s}" for s in SPACES]
    stdin = "".join(line + "\n" for line in lines).encode() + b"hi\n"
    bad_commands = [b"/system \xff", b"/temperature \xc3", b"/system " + b"a" * (2**20 + 10)]
    stdin += b"".join(b + b"\n" + b"hi\n" for b in bad_commands)
    r = chat(["--checkpoint", chat_ckpt], stdin)
    err = r.stderr.decode()
    assert r.returncode == 0 and "unknown command" not in err and "Traceback" not in err, err
    assert err.count("temperature 0.5") == len(SPACES) and err.count("conversation is cleared") == len(SPACES), err
    assert err.count("error: ") == len(bad_commands), err
    assert r.stdout.count(b"\n") == 1 + len(bad_commands), r.stdout  # one line per message "hi", none else


class Endless(io.RawIOBase):
    """`head`, then `byte` for ever and never a line end: stdin from /dev/zero, or from `yes | tr -d '\\n'`."""

    def __init__(self, head: bytes, byte: bytes):
        self.head, self.byte = head, byte

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.head:
            k = min(len(b), len(self.head))
            b[:k], self.head = self.head[:k], self.head[k:]
            return k
        b[:] = self.byte * len(b)
        return len(b)


@settings(max_examples=8)  # each reads 16 MiB and replies to its messages
@given(before=st.lists(st.sampled_from([b"hi", b"/clear", b"/temperature 0.5", b"\xff", b"a" * (2**20 + 5)]),
                       max_size=3),
       start=st.sampled_from([b"", b"/", b"//", b"hello "]), byte=st.integers(0, 255).filter(lambda b: b != 10))
def test_class_a_line_without_end_ends_the_chat_in_one_line_after_the_replies_before_it(chat_ckpt, capsys,
                                                                                       monkeypatch, before, start, byte):
    # `chat.py < /dev/zero` spun for ever: an over-long line was skipped to its end, which never comes
    from inference import chat_cli
    from errors import run_cli

    head = b"".join(line + b"\n" for line in before) + start
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Endless(head, bytes([byte])))))
    with pytest.raises(SystemExit) as exc:
        run_cli(lambda: chat_cli.main(["--checkpoint", str(chat_ckpt), "--device", "cpu", "--max-new-tokens", "3"]))
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert exc.value.code == 2 and "Traceback" not in err, err
    assert errors[-1] == (f"error: line {len(before) + 1} of stdin goes on past 16 MiB without a line end (e.g. "
                          "/dev/zero), so no later message can be found; send one message a line"), err
    # one stdout line per message before it (commands write none), and nothing for the endless one
    assert out.count("\n") == sum(not (m.startswith(b"/") and not m.startswith(b"//")) for m in before), (out, err)


@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_a_plain_models_advice_to_fine_tune_it_runs_as_written(tmp_path, capsys, monkeypatch, tokenizer):
    # for a GPT-2-tokenizer model (ours, or an HF directory) the advised command was refused: sft.yaml's data
    # is characters ("was trained with tokenizer 'gpt2', but this data uses 'char'")
    import shlex

    from inference import chat_cli
    from training import loop
    from data.tasks import write_jsonl
    from errors import run_cli
    from training.config.sections import load_config

    vocab = TOK.vocab_size if tokenizer == "char" else 50257
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, block_size=64, n_layer=1, n_head=2, n_embd=16))
    base = tmp_path / "base dir" / "ckpt.pt"  # a space: the advice quotes the path
    base.parent.mkdir()
    save_checkpoint(base, {"model": model.state_dict(), "model_config": dataclasses.asdict(model.config), "config": {},
                           "tokenizer": {"tokenizer": tokenizer, "chars": CHARS if tokenizer == "char" else None}})
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hi\n")))
    with pytest.raises(SystemExit):
        run_cli(lambda: chat_cli.main(["--checkpoint", str(base), "--device", "cpu"]))
    err = capsys.readouterr().err
    command = shlex.split(err.split("`")[1])
    assert command[:2] == ["python", "train.py"] and "--data.dataset=YOUR.jsonl" in command, err
    rows = [{"messages": [{"role": "user", "content": f"what is {i}+1?"}, {"role": "assistant", "content": f"{i + 1}"}]}
            for i in range(40)]
    rows.append({"messages": [{"role": "user", "content": CHARS}, {"role": "assistant", "content": "ok"}]})  # all of them
    write_jsonl(tmp_path / "talk.jsonl", rows)
    argv = [a.replace("YOUR.jsonl", str(tmp_path / "talk.jsonl")) for a in command[2:]] + [
        f"--data.root={tmp_path / 'prepared'}", f"--train.out_dir={tmp_path / 'sft'}", "--train.max_iters=1",
        "--train.eval_interval=1", "--train.eval_iters=1", "--train.batch_size=2", "--data.val_fraction=0.3",
        "--train.device=cpu", "--train.dtype=float32", "--wandb.mode=disabled"]
    loop.train(load_config(argv))
    assert "chat_template" in torch.load(tmp_path / "sft" / "ckpt.pt", weights_only=True)


def test_chat_reading_dev_zero_ends_with_one_line(chat_ckpt):
    r = warm_runs.run([ROOT / "chat.py", "--checkpoint", chat_ckpt], stdin="/dev/zero", cwd=ROOT, env=ENV, text=False)
    err = r.stderr.decode()
    assert r.returncode == 2 and r.stdout == b"" and err.count("error:") == 1 and "without a line end" in err, err


@pytest.mark.parametrize("text", [b"ab\xffc", b"\xed\xa0\x80"])  # (a subprocess each)
def test_class_system_argument_not_utf8_is_one_line(chat_ckpt, text):
    # argv's undecodable bytes reach Python as lone surrogates: the char tokenizer's traceback
    r = warm_runs.run([ROOT / "chat.py", "--checkpoint", chat_ckpt, "--system", text], input=b"hi\n", cwd=ROOT,
                      env=ENV, text=False)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2 and err.startswith("error: --system is not valid UTF-8") and err.count("\n") == 1, err


@given(digits=st.integers(4301, 6000),
       row=st.sampled_from(['{"messages": [{"role": "user", "content": @}]}', '{"x": @}', '{"messages": [@]}']))
def test_class_row_with_an_integer_over_pythons_digit_limit_says_so(tmp_path_factory, digits, row):
    # int()'s own message ended "use sys.set_int_max_str_digits() to increase the limit": a fix for Python code
    row = row.replace("@", "7" * digits)
    path = tmp_path_factory.mktemp("rows") / "chats.jsonl"
    path.write_text(row + "\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        list(chat_rows(DataConfig(dataset=str(path), format="chat")).read())
    assert "more than 4300 digits" in str(e.value) and "sys." not in str(e.value), str(e.value)


@given(middle=st.binary(max_size=64), cut=st.integers(0, 64), fmt=st.sampled_from(["chat", "text"]))
def test_class_unreadable_parquet_is_one_line(tmp_path_factory, middle, cut, fmt):
    # pyarrow's footer error holds a newline ("Couldn't deserialize thrift: No more data to read.\n"), which
    # went into the UserError as it was: a two-line error
    path = tmp_path_factory.mktemp("pq") / "rows.parquet"
    # a footer of `cut` bytes (of garbage) that the file can hold, so the reader gets as far as parsing it
    path.write_bytes(b"PAR1" + middle + min(cut, len(middle)).to_bytes(4, "little") + b"PAR1")
    with pytest.raises(UserError) as e:
        list(chat_rows(DataConfig(dataset=str(path), format="chat")).read()) if fmt == "chat" else \
            list(open_source(DataConfig(dataset=str(path)), None).read(None))
    assert "\n" not in str(e.value) and str(path) in str(e.value), str(e.value)


@given(form=st.sampled_from(["lines", "array"]), fmt=st.sampled_from(["chat", "text"]),
       gz=st.booleans(), n=st.integers(1, 4))
def test_class_utf8_bom_at_the_start_of_a_json_file_is_not_data(tmp_path_factory, form, fmt, gz, n):
    # Windows tools start UTF-8 files with a BOM: row 1 was "not valid JSON (Unexpected UTF-8 BOM ...)"
    import gzip

    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            if fmt == "chat" else {"text": f"doc {i}"} for i in range(n)]
    body = json.dumps(rows) if form == "array" else "".join(json.dumps(r) + "\n" for r in rows)
    raw = b"\xef\xbb\xbf" + body.encode()
    path = tmp_path_factory.mktemp("bom") / ("rows.json" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(raw) if gz else raw)
    if fmt == "chat":
        got = [c.messages for c in chat_rows(DataConfig(dataset=str(path), format="chat")).read()]
        assert got == [r["messages"] for r in rows]
    else:
        got = "".join(p.text for p in open_source(DataConfig(dataset=str(path)), None).read(None))
        assert all(r["text"] in got for r in rows) and "\ufeff" not in got, got


@given(before=st.integers(0, 3), crs=st.integers(2, 4), fmt=st.sampled_from(["chat", "text"]))
def test_class_rows_ended_by_a_lone_carriage_return_are_named_as_such(tmp_path_factory, before, crs, fmt):
    # rows ended by \r alone read as one line: the error was only "Extra data: line 1 column 93"
    rows = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
                       if fmt == "chat" else {"text": f"doc {i}"}) for i in range(before + crs)]
    path = tmp_path_factory.mktemp("cr") / "rows.jsonl"
    path.write_bytes(("".join(r + "\r\n" for r in rows[:before]) + "\r".join(rows[before:]) + "\n").encode())
    cfg = DataConfig(dataset=str(path), format=fmt)
    with pytest.raises(UserError) as e:
        list(chat_rows(cfg).read()) if fmt == "chat" else list(open_source(cfg, None).read(None))
    assert f"row {before + 1}: " in str(e.value) and "lone \\r (carriage return)" in str(e.value), str(e.value)


@pytest.mark.parametrize("blank", ["\t \u3000"])  # (a subprocess each)
def test_class_blank_system_argument_is_no_system_message_as_blank_slash_system(chat_ckpt, blank):
    # `--system "  "` put a blank system turn (which no training row has) before the chat; `/system  ` removes it
    r = chat(["--checkpoint", chat_ckpt, "--system", blank], b"hi\n/system\n/clear\nhi\n")
    first, second = r.stdout.decode().splitlines()
    assert r.returncode == 0 and first == second, (r.stdout, r.stderr)
