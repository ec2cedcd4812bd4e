"""Hostile inputs to the verifiable-tasks CLIs (python -m data.tasks, python -m eval.chat_tasks), found from
outside: each class is one line on stderr naming the problem and the fix, exit 2, no traceback, nothing
written or overwritten."""
from __future__ import annotations

import os
from pathlib import Path

import contextlib
import json
import io

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from errors import run_cli
from hostile_world import make_kind
from cli_lines import one_error_line

SMALL = ["--train", "20", "--heldout", "4", "--pretrain-lines", "3"]


def cli(main, argv, capsys) -> tuple[int, str]:
    """(exit code, stderr) of `main(argv)` run as its CLI runs it; a traceback fails the test by itself."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: main([str(a) for a in argv]))
    return e.value.code, capsys.readouterr().err


def _cli(main, argv, _=None) -> tuple[int, str]:
    """cli without capsys (a hypothesis test's examples share one fixture)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
        run_cli(lambda: main([str(a) for a in argv]))
    return e.value.code, err.getvalue()


def snapshot(folder: Path) -> dict:
    """Every entry under `folder`: a regular file's bytes, a link's target, else its kind."""
    return {str(p): os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else p.is_dir()
            for p in sorted(folder.rglob("*"))}


def _out_kind(tmp: Path, kind: str) -> Path | str:
    if kind == "file":
        (tmp / "f").write_text("keep"); return tmp / "f"
    if kind == "under a file":
        (tmp / "f").write_text("keep"); return tmp / "f" / "sub"
    if kind == "fifo":
        os.mkfifo(tmp / "p"); return tmp / "p"
    if kind == "broken symlink":
        os.symlink(tmp / "nowhere" / "x", tmp / "l"); return tmp / "l"
    if kind == "symlink loop":
        os.symlink(tmp / "loop", tmp / "loop"); return tmp / "loop"
    if kind == "device":
        return Path("/dev/full")
    if kind == "name too long":
        return tmp / ("x" * 300)
    if kind == "empty":
        return ""  # (not Path(""), which is ".")
    if kind.startswith("a folder at "):  # one of the three outputs is a folder or a link: none is written
        name = kind.removeprefix("a folder at ")
        (tmp / "o").mkdir()
        for other in ("train.jsonl", "heldout.jsonl", "pretrain.txt"):
            (tmp / "o" / other).write_text("keep")
        (tmp / "o" / name).unlink()
        (tmp / "o" / name).mkdir()
        return tmp / "o"
    if kind == "a link at pretrain.txt":
        (tmp / "o").mkdir()
        for other in ("train.jsonl", "heldout.jsonl"):
            (tmp / "o" / other).write_text("keep")
        (tmp / "elsewhere").write_text("keep")
        os.symlink(tmp / "elsewhere", tmp / "o" / "pretrain.txt")
        return tmp / "o"
    raise AssertionError(kind)


OUT_KINDS = ["file", "under a file", "fifo", "broken symlink", "symlink loop", "device", "name too long", "empty",
             "a folder at train.jsonl", "a folder at heldout.jsonl", "a folder at pretrain.txt", "a link at pretrain.txt"]


@pytest.mark.parametrize("kind", OUT_KINDS)
def test_class_tasks_out_that_is_no_writable_folder_is_one_line_and_writes_nothing(tmp_path, capsys, kind):
    # --out was mkdir'ed as it came: a file, a FIFO, /dev/full, a dangling link or a long name was a
    # FileExistsError/OSError traceback, '' wrote into the current folder, and a folder at heldout.jsonl
    # was refused only after train.jsonl had been replaced
    from data.tasks import main

    out = _out_kind(tmp_path, kind)
    before = snapshot(tmp_path)
    code, err = cli(main, ["--out", out, *SMALL], capsys)
    one_error_line(code, err)
    assert "--out" in err or "symlink" in err, err
    assert snapshot(tmp_path) == before


def test_class_tasks_bad_numbers_create_no_out_folder(tmp_path, capsys):
    # the folder was created before the numbers were checked
    from data.tasks import main

    code, err = cli(main, ["--out", tmp_path / "new", "--train", "1"], capsys)
    one_error_line(code, err, "--train")
    assert not (tmp_path / "new").exists()


BOUNDS = {"--train": (2, 1_000_000), "--heldout": (0, 100_000), "--pretrain-lines": (0, 2_000_000),
          "--max-number": (20, 99)}


@settings(max_examples=30, deadline=None)
@given(option=st.sampled_from(sorted(BOUNDS)), below=st.booleans(), by=st.integers(1, 10**30))
def test_class_tasks_counts_out_of_range_are_refused_before_any_work(tmp_path_factory, option, below, by):
    # --train/--pretrain-lines 10**30 ran until memory ran out (a list of that many rows), --heldout 10**30
    # drew 1000 questions per missing one, and --pretrain-lines -5 wrote a file of one line without a word
    from data.tasks import main

    lo, hi = BOUNDS[option]
    out = tmp_path_factory.mktemp("counts") / "new"
    code, err = _cli(main, ["--out", out, *SMALL, option, lo - by if below else hi + by])
    one_error_line(code, err, option.removeprefix("--").split("-")[0])
    assert not out.exists()


@settings(max_examples=20, deadline=None)
@given(top=st.integers(20, 99), over=st.integers(1, 400))
def test_class_tasks_heldout_over_the_arithmetic_questions_there_are_is_refused_by_arithmetic(tmp_path_factory, top, over):
    # --max-number 20 --heldout 400 drew 100,000 questions before "train.jsonl holds nearly every ..."
    from data.tasks import arithmetic_questions, main

    heldout = 4 * arithmetic_questions(top) + over
    if heldout > BOUNDS["--heldout"][1]:
        return
    out = tmp_path_factory.mktemp("held") / "new"
    code, err = _cli(main, ["--out", out, *SMALL, "--heldout", heldout, "--max-number", top], None)
    one_error_line(code, err, "--heldout", "--max-number")
    assert not out.exists()


# the kinds of path every path option meets (tests/hostile_world.py's make_kind), under this file's names
SHARED_KINDS = {"directory": "directory", "fifo nobody writes": "fifo", "broken symlink": "dangling_symlink",
                "empty file": "empty"}


def _tasks_kind(tmp: Path, kind: str) -> str:
    p = tmp / "t.jsonl"
    if kind in SHARED_KINDS:
        make_kind(SHARED_KINDS[kind], p)
    elif kind == "sparse 1 TB":
        with open(p, "wb") as f:
            f.truncate(10**12)
    elif kind == "not UTF-8":
        p.write_bytes(b'{"messages": [{"role": "user", "content": "\xff"}]}\n')
    elif kind == "empty name":
        return ""
    elif kind == "name too long":
        return str(tmp / ("x" * 300))
    elif kind == "name not UTF-8":
        return str(tmp) + "/t\udcff.jsonl"
    return str(p)


TASKS_KINDS = ["directory", "fifo nobody writes", "sparse 1 TB", "broken symlink", "not UTF-8", "empty file",
               "empty name", "name too long", "name not UTF-8"]


@pytest.mark.parametrize("kind", TASKS_KINDS)
def test_class_tasks_file_that_cannot_be_read_is_one_line_bounded_and_before_the_model(tmp_path, capsys, kind):
    # the file was read whole (Path.read_text): a sparse 1 TB file was "out of memory ... lower the batch
    # size", a FIFO nobody writes hung for ever; '' was "cannot read --tasks  (IsADirectoryError)"
    import signal

    from eval.chat_tasks import main

    tasks = _tasks_kind(tmp_path, kind)
    def waited(signum, frame):
        raise TimeoutError("--tasks was waited on for 20 s")

    old = signal.signal(signal.SIGALRM, waited)
    signal.alarm(20)  # (the FIFO waited for ever)
    try:  # the checkpoint is missing too: the tasks file is read first, so its line is the one said
        code, err = cli(main, ["--checkpoint", tmp_path / "no-checkpoint", "--tasks", tasks], capsys)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    one_error_line(code, err, "no rows" if kind in ("empty file", "fifo nobody writes") else "--tasks")
    assert "memory" not in err and "checkpoint" not in err, err


def test_class_tasks_row_that_would_take_gigabytes_to_parse_is_refused_unparsed(tmp_path, capsys):
    """A 40 MB row of 13M empty objects took ~1.6 GB in json.loads before its 'not a task' line (rows of the file,
    which may be 256 MiB, were parsed with no estimate): refused by its length (a row is at most 1 MiB), unparsed."""
    from eval.chat_tasks import main

    tasks = tmp_path / "t.jsonl"
    tasks.write_bytes(b'{"messages": [' + b"{}," * 13_000_000 + b'{}]}\n')
    code, err = cli(main, ["--checkpoint", tmp_path / "no-checkpoint", "--tasks", tasks], capsys)
    one_error_line(code, err, "--tasks", "row 1: it is over 1,048,576 bytes", "data.tasks")


def test_class_tasks_stream_that_is_no_rows_is_refused_holding_one_row_not_the_256_mib_bound(tmp_path, capsys):
    # the file was read whole up to its bound before a row was parsed: /dev/zero held 256 MiB of zeros (512 MiB
    # with the join) before its "larger than 256 MiB" line
    import tracemalloc

    from eval.chat_tasks import main

    tracemalloc.start()
    try:
        code, err = cli(main, ["--checkpoint", tmp_path / "no-checkpoint", "--tasks", "/dev/zero"], capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_error_line(code, err, "/dev/zero, row 1: ", "over 1,048,576 bytes")
    assert peak < 16 * 2**20, peak  # a row and a chunk or two of 1 MiB


ROW = st.fixed_dictionaries({"kind": st.sampled_from(["arithmetic", "count"]), "messages": st.tuples(
    st.fixed_dictionaries({"role": st.just("user"), "content": st.text(st.characters(codec="utf-8"), min_size=1,
                                                                    max_size=8).filter(str.strip)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.sampled_from(["1", "a\u2028b", "x\x85y"])}))
    .map(list)})


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(ROW, min_size=1, max_size=4), end=st.sampled_from(["\n", "\r\n", "\r"]), bom=st.booleans(),
       raw=st.booleans())
def test_class_tasks_rows_are_read_whatever_their_line_ends_bom_or_unicode_line_separators(tmp_path_factory, rows, end,
                                                                                            bom, raw):
    # str.splitlines() split a row at a raw U+2028, U+0085, \x1c... inside its JSON strings, and a BOM made
    # row 1 "not a conversation": valid rows refused as bad ones
    import json

    from eval.chat_tasks import read_rows

    path = tmp_path_factory.mktemp("rows") / "t.jsonl"
    body = "".join(json.dumps(r, ensure_ascii=not raw) + end for r in rows)
    path.write_bytes(b"\xef\xbb\xbf" * bom + body.encode("utf-8", "surrogatepass"))
    assert read_rows(path) == rows


def _row(user="What is 12 + 13?", answer="25", **kw) -> dict:
    return {"kind": "arithmetic", **kw, "messages": [{"role": "user", "content": user},
                                                    {"role": "assistant", "content": answer}]}


BAD_ROWS = {  # every shape of row that is JSON but no task to score; (the raw line, as written)
    "list": "[1, 2]", "number": "5", "null": "null", "string": '"hi"', "no messages": '{"kind": "count"}',
    "messages a string": '{"messages": "ab"}', "messages an object": '{"messages": {"a": 1}}',
    "messages empty": '{"messages": []}',
    "last from the user": json.dumps({"messages": [{"role": "user", "content": "x"}]}),
    "only an assistant turn": json.dumps({"messages": [{"role": "assistant", "content": "x"}]}),
    "a message not an object": json.dumps({"messages": [1, {"role": "assistant", "content": "x"}]}),
    "a role nobody knows": json.dumps({"messages": [{"role": "bob", "content": "x"}, {"role": "assistant", "content": "x"}]}),
    "question not text": json.dumps(_row(user=7)), "answer not text": json.dumps(_row(answer=5)),
    "answer null": json.dumps(_row(answer=None)), "empty question": json.dumps(_row(user="")),
    "empty answer": json.dumps(_row(answer="")), "blank answer": json.dumps(_row(answer=" \t")),
    "lone surrogate in the question": json.dumps(_row(user="a@")).replace("@", "\\ud800"),
    "lone surrogate in the answer": json.dumps(_row(answer="a@")).replace("@", "\\udfff"),
    "kind a list": json.dumps(_row(kind=[1])), "kind an object": json.dumps(_row(kind={"a": 1})),
    "kind a number": json.dumps(_row(kind=5)), "kind null": json.dumps(_row(kind=None)),
    "kind empty": json.dumps(_row(kind="")),
    "two system turns": json.dumps({"messages": [{"role": "system", "content": "s"}] * 2 + _row()["messages"]}),
    "an integer of 5000 digits": json.dumps(_row()).replace('"25"}', '"25", "n": ' + "7" * 5000 + "}"),
    "nested 100000 deep": "[" * 100_000 + "]" * 100_000,
    "not JSON": "{messages",
    "question outside a char model's vocabulary": json.dumps(_row(user="é€☃")),
    "answer outside a char model's vocabulary": json.dumps(_row(answer="€")),
}


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    from chat_models import save_chat_checkpoint, tiny_chat_model

    return save_chat_checkpoint(tmp_path_factory.mktemp("chat") / "ckpt.pt", tiny_chat_model(end_bias=5.0))


@pytest.mark.parametrize("name", sorted(BAD_ROWS))
def test_class_tasks_row_that_is_no_task_to_score_is_one_line_naming_its_row(tmp_path, capsys, chat_ckpt, name):
    # a kind that is not a name was a TypeError traceback (unhashable, or unsortable with the others); a bad
    # question was "the prompt: message 1 ..." with no file or row, after the model was loaded; an empty
    # answer scored whenever the model said nothing, a lone surrogate or a character outside a char
    # model's vocabulary in it could never be matched: counted wrong, silently
    from eval.chat_tasks import main

    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps(_row()) + "\n\n" + BAD_ROWS[name] + "\n" + json.dumps(_row()) + "\n")
    code, err = cli(main, ["--checkpoint", chat_ckpt, "--tasks", tasks], capsys)
    one_error_line(code, err, f"{tasks}, row 3: ")


@pytest.mark.parametrize("value", ["", "x" * 300, "ck\udcff.pt", "a\0b"])
def test_class_tasks_checkpoint_value_that_is_no_usable_path_is_argparses_one_line(tmp_path, capsys, value):
    # --checkpoint was the one path option of the chat CLIs without path_arg: '' was "no ckpt.pt in directory ."
    from eval.chat_tasks import main

    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps(_row()) + "\n")
    code, err = cli(main, ["--checkpoint", value, "--tasks", tasks], capsys)
    one_error_line(code, err, "argument --checkpoint", "give a usable path")


# the tiny chat model's context (chat_models.tiny_chat_model's block_size); a row of a question of q chars and
# an answer of a chars is, with the char tokenizer's one id a character, <|user|> q <|end|> <|assistant|> a
# <|end|>: q + a + 4 ids, of which the model reads all but the closing <|end|>, q + a + 3
CONTEXT = 64


@settings(max_examples=12, deadline=None)
@given(q=st.integers(1, CONTEXT + 10), a=st.integers(1, 6), row=st.integers(1, 3))
@example(q=CONTEXT - 7, a=4, row=2).via("the longest row that fits")
@example(q=CONTEXT - 6, a=4, row=3).via("one token past the context")
def test_class_tasks_row_longer_than_the_models_context_is_refused_before_scoring(chat_ckpt, q, a, row):
    # such a row was generated from a cropped prompt (model/generate.py's crop rule) and scored wrong, silently
    import tempfile

    from eval.chat_tasks import main

    rows = [_row()] * 3
    rows[row - 1] = _row(user="w" * q, answer="7" * a)
    with tempfile.TemporaryDirectory() as tmp:
        tasks = Path(tmp) / "t.jsonl"
        tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
        code, err = _cli(main, ["--checkpoint", chat_ckpt, "--tasks", tasks])
    if q + a + 3 <= CONTEXT:
        assert code == 0 and err == "", err
    else:
        one_error_line(code, err, f"{tasks}, row {row}: ", f"need {q + a + 3} tokens", f"model's {CONTEXT} (block_size)",
                 "shorten or drop")


def test_class_tasks_row_longer_than_the_context_is_refused_by_score_too():
    # score() is the other place where rows meet a model (tests/test_sft.py calls it with rows of its own)
    from chat_models import char_tok, tiny_chat_model
    from data.chat_template import template_for
    from errors import UserError
    from eval.chat_tasks import score

    tok = char_tok()
    rows = [_row(), _row(user="w" * (CONTEXT - 3), answer="7")]  # needs 65
    with pytest.raises(UserError, match=r"row 2: its prompt and answer need 65 tokens"):
        score(tiny_chat_model(block_size=CONTEXT), tok, template_for(tok), rows)
    assert score(tiny_chat_model(block_size=CONTEXT + 1), tok, template_for(tok), rows)["total"] == 2
