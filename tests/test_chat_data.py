"""Conversations as data (data/conversations.py): every class of bad row is one line naming the file, the row
and the fault, through `python -m data.prepare` and train.py's preparation; data.skip_bad_rows counts them per
fault; every source form reads the same conversations."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import data.prepare
from data import DataConfig, prepare_data
from data.conversations import (EMPTY, NO_ASSISTANT, NO_MESSAGES, NO_ROLE_OR_CONTENT, NOT_A_LIST, NOT_ALTERNATING,
                                NOT_AN_OBJECT, NOT_TEXT, SYSTEM_NOT_FIRST, TOO_LONG, UNKNOWN_ROLE, chat_rows, fault_kind,
                                message_fault, skip_report)
from errors import UserError, run_cli

text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12).filter(str.strip)
not_str = st.one_of(st.none(), st.integers(), st.booleans(), st.floats(allow_nan=False), st.lists(st.integers(), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@st.composite
def good_messages(draw, min_turns: int = 1):
    msgs = [{"role": "system", "content": draw(text)}] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(min_turns, 3))):
        msgs += [{"role": "user", "content": draw(text)}, {"role": "assistant", "content": draw(text)}]
    return msgs


@st.composite
def bad_row(draw, kind: str) -> tuple[dict, list[str]]:
    """A row broken in the way `kind` names, and words its error must hold."""
    msgs = draw(good_messages())
    first = 1 if msgs[0]["role"] == "system" else 0
    k = draw(st.integers(0, len(msgs) - 1))
    if kind == NO_MESSAGES:
        return {"conversation": msgs}, ["no 'messages' field", "data.messages_field"]
    if kind == NOT_A_LIST:
        return {"messages": draw(st.one_of(text, st.integers(), st.none(), st.just({"role": "user"})))}, ["not a list"]
    if kind == NOT_AN_OBJECT:
        msgs[k] = draw(st.one_of(text, st.integers(), st.none(), st.lists(text, max_size=2)))
        return {"messages": msgs}, [f"message {k + 1} is a", "not an object"]
    if kind == NO_ROLE_OR_CONTENT:
        key = draw(st.sampled_from(["role", "content"]))
        del msgs[k][key]
        return {"messages": msgs}, [f"message {k + 1} has no {key!r}"]
    if kind == UNKNOWN_ROLE:
        msgs[k]["role"] = draw(st.one_of(text.filter(lambda r: r not in ("system", "user", "assistant")), not_str))
        return {"messages": msgs}, [f"message {k + 1} has role", "roles are system, user and assistant"]
    if kind == NOT_TEXT:
        msgs[k]["content"] = draw(not_str)
        return {"messages": msgs}, [f"message {k + 1} ({msgs[k]['role']}) has", "as content, not text"]
    if kind == EMPTY:
        msgs[k]["content"] = draw(st.sampled_from(["", " ", "\n\t "]))
        return {"messages": msgs}, [f"message {k + 1} ({msgs[k]['role']}) has empty content"]
    if kind == SYSTEM_NOT_FIRST:
        at = draw(st.integers(1, len(msgs)))
        msgs.insert(at, {"role": "system", "content": draw(text)})
        return {"messages": msgs}, [f"message {at + 1} is a system turn", "only the first"]
    if kind == NOT_ALTERNATING:
        how = draw(st.sampled_from(["repeat", "assistant first", "trailing user"]))
        if how == "repeat":
            at = draw(st.integers(first, len(msgs) - 1))
            msgs.insert(at, dict(msgs[at]))
            role = ("an " if msgs[at]["role"] == "assistant" else "a ") + msgs[at]["role"]
            return {"messages": msgs}, [f"message {at + 2} is {role} turn after {role} turn"]
        if how == "assistant first":
            del msgs[first]
            return {"messages": msgs}, [f"message {first + 1} is an assistant turn first", "turns alternate"]
        msgs.append({"role": "user", "content": draw(text)})
        return {"messages": msgs}, [f"its last message ({len(msgs)}) is a user turn with no reply"]
    assert kind == NO_ASSISTANT
    msgs = msgs[: first + 1] if draw(st.booleans()) else []
    return {"messages": msgs}, ["it has no assistant turn" if msgs else "it has no messages"]


KINDS = [NO_MESSAGES, NOT_A_LIST, NOT_AN_OBJECT, NO_ROLE_OR_CONTENT, UNKNOWN_ROLE, NOT_TEXT, EMPTY, SYSTEM_NOT_FIRST,
         NOT_ALTERNATING, NO_ASSISTANT]


def write_jsonl(path: Path, rows: list, opener=open) -> Path:
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prepare_cli(*args: str) -> None:
    """`python -m data.prepare ...`, in this process (run_cli prints a UserError as its one line)."""
    data.prepare.main([*args, "--format", "chat", "--no-progress"])


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_each_class_of_bad_row_is_one_line_naming_file_row_and_fault(tmp_path_factory, kind, data):
    row, words = data.draw(bad_row(kind))
    if kind != NO_MESSAGES:
        assert fault_kind(message_fault(row["messages"])) == kind
    good = [{"messages": data.draw(good_messages())} for _ in range(data.draw(st.integers(0, 3)))]
    at = data.draw(st.integers(0, len(good)))
    path = write_jsonl(tmp_path_factory.mktemp("bad") / "chats.jsonl", good[:at] + [row] + good[at:])
    with pytest.raises(UserError) as e:  # the reader every entry point's prepare reads through (fsync-free)
        list(chat_rows(DataConfig(dataset=str(path), format="chat")).read())
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}, row {at + 1}: "), msg
    assert "data.skip_bad_rows: true" in msg, msg
    for w in words:
        assert w in msg, (w, msg)


U, A, S = ({"role": r, "content": "x"} for r in ("user", "assistant", "system"))
ONE_OF_EACH = {NO_MESSAGES: {"text": "hi"}, NOT_A_LIST: {"messages": "hi"}, NOT_AN_OBJECT: {"messages": [U, "hi"]},
               NO_ROLE_OR_CONTENT: {"messages": [U, {"role": "assistant"}]},
               UNKNOWN_ROLE: {"messages": [U, {"role": "bot", "content": "x"}]},
               NOT_TEXT: {"messages": [U, {"role": "assistant", "content": None}]},
               EMPTY: {"messages": [U, {"role": "assistant", "content": " "}]}, SYSTEM_NOT_FIRST: {"messages": [U, S, A]},
               NOT_ALTERNATING: {"messages": [U, A, A]}, NO_ASSISTANT: {"messages": [S, U]}}


@pytest.mark.parametrize("kind", KINDS)
def test_each_class_of_bad_row_is_the_same_line_through_python_m_data_prepare(tmp_path, capsys, kind):
    path = write_jsonl(tmp_path / "chats.jsonl", [{"messages": CONVS[0]}, ONE_OF_EACH[kind]])
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: prepare_cli("--dataset", str(path), "--root", str(tmp_path / "p")))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(f"error: {path}, row 2: "), err
    assert fault_kind(err[len(f"error: {path}, row 2: "):].split("; fix that row")[0]) == kind, err


def test_a_conversation_too_long_to_travel_whole_is_a_bad_row(tmp_path, monkeypatch):
    import data.messages

    monkeypatch.setattr(data.messages, "CHUNK_CHARS", 200)  # documents longer than this are cut into pieces
    long = {"messages": [{"role": "user", "content": "a" * 100}, {"role": "assistant", "content": "b" * 100}]}
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVS[0]}, long])
    with pytest.raises(UserError, match=r"c\.jsonl, row 2: its conversation is over 200 characters"):
        prepare_cli("--dataset", str(path), "--root", str(tmp_path / "p"))
    chats = chat_rows(DataConfig(dataset=str(path), format="chat", skip_bad_rows=True))
    assert [c.messages for c in chats.read()] == [CONVS[0]] and chats.skipped() == {TOO_LONG: 1}


def test_skip_bad_rows_skips_each_class_and_prints_the_count_per_fault(tmp_path, capsys):
    rows = []
    for n, kind in enumerate(KINDS):  # a bad row of every class (two empty ones), each before a good row
        for _ in range(2 if kind == EMPTY else 1):
            rows += [ONE_OF_EACH[kind], {"messages": [{"role": "user", "content": f"q{n}"}, A]}]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    cfg = DataConfig(dataset=str(path), format="chat", skip_bad_rows=True)
    chats = chat_rows(cfg)
    got = list(chats.read())
    assert [c.pos for c in got] == [[0, k] for k in range(1, len(rows), 2)]
    want = {kind: 2 if kind == EMPTY else 1 for kind in KINDS}
    assert chats.skipped() == want
    line = skip_report(chats.skipped())
    assert line.startswith(f"skipped {len(KINDS) + 1} bad conversation row(s)") and "2 empty content, 1 " in line
    prepare_cli("--dataset", str(path), "--root", str(tmp_path / "p"), "--skip-bad-rows")  # the same line on stderr
    assert line in capsys.readouterr().err


@given(data=st.data(), kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6),
       tokenizer=st.sampled_from(["char", "gpt2"]), entry=st.sampled_from(["python -m data.prepare", "prepare_data"]))
def test_every_row_skipped_as_bad_is_one_line_with_the_count_per_fault(tmp_path_factory, capsys, data, kinds,
                                                                         tokenizer, entry):
    """The class: a source whose rows are all bad, in any mix of the ways a conversation can be, with
    data.skip_bad_rows. The one line says all N rows were skipped as bad, the count per fault, and the first
    fault (with its own fix): not "contains no text; point it at non-empty text"."""
    rows = [data.draw(bad_row(kind))[0] for kind in kinds]
    tmp = tmp_path_factory.mktemp("allbad")
    path = write_jsonl(tmp / "chats.jsonl", rows)
    args = ["--dataset", str(path), "--root", str(tmp / "p"), "--tokenizer", tokenizer, "--skip-bad-rows"]
    if entry == "prepare_data":
        with pytest.raises(UserError) as e:
            prepare_data(DataConfig(dataset=str(path), root=str(tmp / "p"), tokenizer=tokenizer,
                                                 format="chat", skip_bad_rows=True), progress=False)
        msg = str(e.value)
    else:
        with pytest.raises(SystemExit):
            run_cli(lambda: prepare_cli(*args))
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: "), err
        msg = err[len("error: "):-1]
    assert "\n" not in msg and f"all {len(rows)} of its rows with content were skipped as bad" in msg, msg
    for kind in set(kinds):  # the count of each fault, by the kinds the rows were made with
        assert f"{kinds.count(kind)} {kind}" in msg, (kind, msg)
    assert f"the first, {path}, row 1: {message_fault(rows[0].get('messages')) if 'messages' in rows[0] else ''}" in msg
    if kinds[0] == NO_MESSAGES:
        assert "data.messages_field" in msg, msg
    assert "point it at non-empty text" not in msg


CONVS = [[{"role": "user", "content": f"what is {i} + {i}?"}, {"role": "assistant", "content": str(2 * i)}]
         for i in range(7)] + [[{"role": "system", "content": "Reply in French."}, {"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "salut 🎉"}]]


@pytest.mark.parametrize("form", ["jsonl.gz", "jsonl.zst", "json-array", "parquet", "folder", "save_to_disk", "hf"])
def test_every_source_form_reads_the_conversations_and_names_a_bad_row(tmp_path, monkeypatch, form):
    rows = [{"id": i, "messages": [{**m, "name": "x"} for m in c]} for i, c in enumerate(CONVS)]  # extra keys ignored
    bad = {"id": 99, "messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "hello"}]}
    src = tmp_path / "src"
    src.mkdir()

    def write(rows):
        if form == "jsonl.gz":
            return write_jsonl(src / "a.jsonl.gz", rows, gzip.open)
        if form == "jsonl.zst":
            with pa.output_stream(str(src / "a.jsonl.zst"), compression="zstd") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows).encode())
            return src / "a.jsonl.zst"
        if form == "json-array":
            (src / "a.json").write_text(json.dumps(rows))
            return src / "a.json"
        if form == "parquet":
            pq.write_table(pa.Table.from_pylist(rows), src / "a.parquet", row_group_size=3)
            return src / "a.parquet"
        if form == "folder":  # its row files; a text file beside them is not a conversation, and is left out
            write_jsonl(src / "1.jsonl", rows[:3])
            pq.write_table(pa.Table.from_pylist(rows[3:]), src / "2.parquet")
            (src / "notes.txt").write_text("not conversations")
            return src
        ds = datasets.Dataset.from_list(rows)
        if form == "save_to_disk":
            ds.save_to_disk(str(src / "saved"))
            return src / "saved"
        monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: ds)
        return "hf:x/chats"

    spec = write(rows)
    got = [c.messages for c in chat_rows(DataConfig(dataset=str(spec), format="chat")).read()]
    assert got == CONVS
    for p in src.iterdir():
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    spec = write(rows[:5] + [bad] + rows[5:])
    with pytest.raises(UserError) as e:
        prepare_cli("--dataset", str(spec), "--root", str(tmp_path / "p"))
    where = "row 6 of HF dataset 'x/chats'" if form == "hf" else ("row 6 of dataset saved at" if form == "save_to_disk"
                                                                  else ", row 3: " if form == "folder" else ", row 6: ")
    assert "\n" not in str(e.value) and where in str(e.value) and "has role 'bot'" in str(e.value), str(e.value)


def test_a_text_source_as_chat_and_a_bad_format_are_one_line(tmp_path):
    (tmp_path / "a.txt").write_text("plain text")
    for dataset, words in (("shakespeare", "is text, not conversations"), (str(tmp_path / "a.txt"), "a text file")):
        with pytest.raises(UserError, match=words):
            prepare_cli("--dataset", dataset, "--root", str(tmp_path / "p"))
    with pytest.raises(UserError, match="data.format must be one of text, chat"):
        DataConfig(format="conversations").validate()


def test_train_py_refuses_a_bad_conversation_row_in_one_line(tmp_path):
    from training import loop
    from training.config.sections import load_config

    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVS[0]}, {"messages": [{"role": "user", "content": 3}]}])
    cfg = load_config([f"--train.out_dir={tmp_path / 'out'}", f"--data.root={tmp_path / 'data'}", f"--data.dataset={path}",
                       "--data.format=chat", "--wandb.mode=disabled"])
    with pytest.raises(UserError) as e:
        loop.train(cfg)
    assert str(e.value).startswith(f"{path}, row 2: message 1 (user) has a int as content, not text;"), str(e.value)


@given(value=st.text(max_size=30).filter(lambda v: v.strip() not in ("text", "chat")))
def test_class_bad_data_format_is_one_line_naming_the_key_from_the_command_line(value):
    """data.format's whole class of bad values (any other text, blank, control characters), through train.py's
    config entry: one line naming data.format, never a traceback or a silent fallback to text."""
    from training.config.sections import load_config

    assume("\x00" not in value)  # (argv cannot hold a NUL)
    with pytest.raises(UserError) as e:
        load_config([f"--data.format={value}"])
    assert "\n" not in str(e.value) and "data.format" in str(e.value), str(e.value)
