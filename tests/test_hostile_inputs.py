"""Inputs that used to give a traceback or a misleading line.

Deep JSON: every JSON reader of ours (a jsonl or .json source row, HellaSwag's jsonl, metrics.jsonl for
training.plot and the model card, a prepared folder's meta.json, an HF directory's config.json, the
cache of measured choices, a lock file, a folder's owner marker) given a document nested deeper
than the parser recurses: one line (or the row skipped, as a torn line is), never a RecursionError. The depth is drawn by hypothesis,
from shallow to far past Python's recursion limit.

Misleading lines: a huge (sparse) metrics file is refused by its size, naming it, not reported as "out of
memory; lower the batch size"; a checkpoint read from a pipe is "not a regular file", not "corrupt or
truncated", for every reader; a checkpoint saved at a negative step is refused naming the checkpoint.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

import eval.hellaswag as hellaswag
from inference import sample_cli
from training.config.sections import load_config
from training import loop
from training import cli as train_cli
from checkpoint import load_checkpoint, save_checkpoint
from checkpoint.export import main as export_main
from data.prepare import main as prepare_main
from locks import DirLock
from runtime import choices
from training import plot

from hostile_world import SAMPLE_FAST, run_entry, train_argv
from cli_lines import an_error_line



def nested(depth: int, kind: str) -> str:
    """A JSON document `depth` levels deep: lists, or objects whose every value is the next level."""
    return "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth


DEPTHS = st.one_of(st.sampled_from([1, 50, 999, 1000, 3000, 100_000]), st.integers(1, 200_000))
KINDS = st.sampled_from(["list", "object"])


# ------------------------------------------------------------------------------------------ deep JSON

def deep_jsonl_source(tmp: Path, doc: str, world) -> list[str]:
    """A jsonl corpus whose second row is `doc`, or holds it in the text field."""
    rows = [json.dumps({"text": "To be, or not to be. " * 20}), doc, '{"text": ' + doc + "}"]
    (tmp / "corpus.jsonl").write_text("\n".join(rows) + "\n")
    return ["--dataset", tmp / "corpus.jsonl", "--tokenizer", "char", "--root", tmp / "prepared", "--no-progress"]


def deep_json_array(tmp: Path, doc: str, world) -> list[str]:
    (tmp / "corpus.json").write_text("[" + json.dumps({"text": "To be. " * 20}) + "," + doc + "]")
    return ["--dataset", tmp / "corpus.json", "--tokenizer", "char", "--root", tmp / "prepared", "--no-progress"]


def deep_hellaswag(tmp: Path, doc: str, world) -> list[str]:
    (tmp / "hs.jsonl").write_text(world.hellaswag.read_text() + doc + "\n")
    return ["--checkpoint", world.gpt2, "--data", tmp / "hs.jsonl", "--device", "cpu"]


def deep_metrics(tmp: Path, doc: str, world) -> list[str]:
    run = tmp / "run"
    run.mkdir()
    lines = (world.run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], doc, *lines[1:]]) + "\n")
    return [run, "--out", tmp / "c.png"]


def deep_meta(tmp: Path, doc: str, world) -> list[str]:
    argv = ["--dataset", world.corpus, "--tokenizer", "char", "--root", tmp / "prepared", "--no-progress"]
    built = next((world.root / "prepared-once").glob("*/meta.json"))
    shutil.copytree(built.parent, tmp / "prepared" / built.parent.name)
    (tmp / "prepared" / built.parent.name / "meta.json").write_text(doc)
    return argv


def deep_hf_config(tmp: Path, doc: str, world) -> list[str]:
    (tmp / "hf").mkdir()
    (tmp / "hf" / "config.json").write_text(doc)
    (tmp / "hf" / "model.safetensors").write_bytes(b"weights")  # there, so that config.json is what is read
    return ["--checkpoint", tmp / "hf", *SAMPLE_FAST]


def deep_model_card_metrics(tmp: Path, doc: str, world) -> list[str]:
    run = tmp / "run"
    run.mkdir()
    shutil.copy(world.gpt2, run / "ckpt.pt")
    (run / "metrics.jsonl").write_text(doc + "\n" + json.dumps({"iter": 0, "val/loss": 1.0}) + "\n")
    return ["--checkpoint", run, "--out", tmp / "hf"]


def deep_lock(tmp: Path, doc: str, world) -> list[str]:
    out = tmp / "out"
    out.mkdir()
    (out / ".train.lock").write_text(doc)
    os.utime(out / ".train.lock", (0, 0))  # old: not a lock being written right now
    return train_argv(out, world.data_root)


def deep_owner_marker(tmp: Path, doc: str, world) -> list[str]:
    (tmp / "hf").mkdir()
    (tmp / "hf" / ".smallgpt-owner.json").write_text(doc)  # ownership.MARKER: which command owns the folder
    return ["--checkpoint", world.gpt2, "--out", tmp / "hf"]


READERS = {
    "data.prepare jsonl": (prepare_main, deep_jsonl_source),
    "data.prepare json array": (prepare_main, deep_json_array),
    "eval.hellaswag --data": (hellaswag.main, deep_hellaswag),
    "training.plot metrics.jsonl": (plot.main, deep_metrics),
    "data.prepare meta.json": (prepare_main, deep_meta),
    "sample.py HF config.json": (sample_cli.main, deep_hf_config),
    "checkpoint.export model card": (export_main, deep_model_card_metrics),
    "train.py lock file": (train_cli.main, deep_lock),
    "checkpoint.export folder owner marker": (export_main, deep_owner_marker),
}


@pytest.fixture(scope="module")
def prepared_once(world):
    """A prepared folder of world.corpus, copied by deep_meta."""
    root = world.root / "prepared-once"
    if not root.exists():
        prepare_main(["--dataset", str(world.corpus), "--tokenizer", "char", "--root", str(root), "--no-progress"])
    return root


# each example runs a whole command: a fifth of the profile's examples per reader (4 in CI, 60 with dev)
FEW = settings(max_examples=max(3, settings().max_examples // 5))


@pytest.mark.parametrize("reader", READERS)
@FEW
@given(depth=DEPTHS, kind=KINDS)
@example(depth=100_000, kind="list")
def test_json_nested_past_the_parsers_depth_is_one_line_or_skipped(world, prepared_once, tmp_path_factory, capsys,
                                                                    reader, depth, kind):
    main, make = READERS[reader]
    tmp = tmp_path_factory.mktemp("deep")
    code, _, err = run_entry(main, make(tmp, nested(depth, kind), world), capsys)
    assert "RecursionError" not in err and "Traceback" not in err
    if code != 0:
        an_error_line(code, err)


@given(depth=DEPTHS, kind=KINDS)
@example(depth=100_000, kind="object")
def test_the_choice_cache_and_a_lock_nested_too_deep_read_as_empty_or_torn(tmp_path_factory, depth, kind):
    choices.cache_path().parent.mkdir(parents=True, exist_ok=True)
    choices.cache_path().write_text(nested(depth, kind))
    assert isinstance(choices._read(), (dict, type(None)))  # entries, or None where damaged (measured again)
    folder = tmp_path_factory.mktemp("lock")
    (folder / ".lock").write_text(nested(depth, kind))
    os.utime(folder / ".lock", (0, 0))
    assert DirLock(folder).holder() is None  # torn long ago: free




# ------------------------------------------------------------------------------------------ misleading lines

def test_a_huge_sparse_metrics_file_is_refused_by_its_size_naming_it(world, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    metrics = run / "metrics.jsonl"
    shutil.copy(world.run / "metrics.jsonl", metrics)
    with open(metrics, "r+b") as f:
        f.truncate(100 * 2**30)  # 100 GB, sparse: no disk used
    code, _, err = run_entry(plot.main, [run, "--out", tmp_path / "c.png"], capsys)
    line = an_error_line(code, err, str(metrics), "larger than")
    assert "memory" not in line and "batch size" not in line



@contextlib.contextmanager
def piped(path: Path):
    """/dev/fd/N: the read end of a pipe that a thread fills with `path`'s bytes (`<(cat ckpt.pt)`)."""
    r, w = os.pipe()

    def feed():
        with contextlib.suppress(OSError):
            with os.fdopen(w, "wb") as f:
                f.write(path.read_bytes())
    t = threading.Thread(target=feed, daemon=True)
    t.start()
    try:
        yield Path(f"/dev/fd/{r}")
    finally:
        os.close(r)  # the writer, if still writing, gets EPIPE and ends
        t.join(5)


PIPE_READERS = {
    "sample.py": lambda p, w, t: (sample_cli.main, ["--checkpoint", p, *SAMPLE_FAST]),
    "eval.hellaswag": lambda p, w, t: (hellaswag.main, ["--checkpoint", p, "--data", w.hellaswag, "--device", "cpu"]),
    "checkpoint.export": lambda p, w, t: (export_main, ["--checkpoint", p, "--out", t / "hf"]),
    "model.init_from": lambda p, w, t: (train_cli.main, [*train_argv(t / "out", w.data_root), f"--model.init_from={p}"]),
}


@pytest.mark.parametrize("reader", PIPE_READERS)
def test_a_checkpoint_from_a_pipe_is_said_to_need_a_regular_file(world, tmp_path, capsys, reader):
    with piped(world.ckpt if reader != "eval.hellaswag" and reader != "checkpoint.export" else world.gpt2) as fd:
        main, argv = PIPE_READERS[reader](fd, world, tmp_path)
        code, _, err = run_entry(main, argv, capsys)
    line = an_error_line(code, err, str(fd), "not a regular file")
    assert "corrupt" not in line and "truncated" not in line


@pytest.mark.parametrize("counter,value", [("iter", -3), ("tokens_seen", -1), ("iter", 2.5)])
def test_a_checkpoint_at_a_negative_step_is_refused_naming_it(world, tmp_path, capsys, counter, value):
    out = tmp_path / "out"
    shutil.copytree(world.ckpt.parent, out)
    ckpt = load_checkpoint(out / "ckpt.pt")
    ckpt["train"][counter] = value
    save_checkpoint(out / "ckpt.pt", ckpt)
    before = (out / "ckpt.pt").read_bytes()
    code, _, err = run_entry(train_cli.main, train_argv(out, world.data_root, "--train.max_iters=4"), capsys)
    an_error_line(code, err, str(out / "ckpt.pt"), counter)
    assert (out / "ckpt.pt").read_bytes() == before


# ------------------------------------------------------------------ the data changed under a resumable run

MINI = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(40))
EDITS = {  # every way a source's content can change: text added, removed or replaced, anywhere
    "append": lambda text, extra, at: text + extra,
    "insert": lambda text, extra, at: text[:at] + extra + text[at:],
    "replace": lambda text, extra, at: text[:at] + extra + text[at + len(extra):],
    "cut": lambda text, extra, at: text[:at] + text[at + len(extra):],
}


@pytest.fixture(scope="module")
def resumable(tmp_path_factory):
    """A run into run/ on mini.txt prepared under prep/ (a checkpoint to resume), and a pristine copy of all."""
    base = tmp_path_factory.mktemp("changed") / "w"
    base.mkdir()
    (base / "mini.txt").write_text(MINI, encoding="utf-8")
    with contextlib.redirect_stdout(io.StringIO()):
        loop.train(load_config(train_argv(base / "run", base / "prep", f"--data.dataset={base / 'mini.txt'}")))
    pristine = base.parent / "pristine"
    shutil.copytree(base, pristine)
    return base, pristine


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".readers" not in p.parts and not p.name.endswith(".lock")}


@given(edit=st.sampled_from(sorted(EDITS)), extra=st.text("ab xyz\n.", min_size=1, max_size=12),
       at=st.integers(0, len(MINI) - 1), prepared_since=st.booleans())
def test_a_source_changed_since_the_checkpoint_is_one_line_before_anything_is_rebuilt(resumable, capsys, edit, extra,
                                                                                       at, prepared_since):
    """The class: the source's content changed in any way since the run's checkpoint, and the same train
    command is run again. One line says the data changed since the checkpoint (naming data.dataset) with the
    fixes (the original data back, or a new out_dir), never "the checkpoint is malformed"; the prepared dir
    that holds the checkpoint's tokens is refused before it is rebuilt (byte for byte as it was), and one
    prepared anew since (`python -m data.prepare` run on the changed source) gets the same line."""
    base, pristine = resumable
    shutil.rmtree(base)
    shutil.copytree(pristine, base)
    src = base / "mini.txt"
    changed = EDITS[edit](MINI, extra, at)
    if changed == MINI:
        return
    src.write_text(changed, encoding="utf-8")
    if prepared_since:
        assert prepare_main(["--dataset", str(src), "--tokenizer", "char", "--root", str(base / "prep"),
                             "--no-progress"]) in (0, None)
        capsys.readouterr()
    before = snapshot(base / "prep")
    code, _, err = run_entry(train_cli.main, train_argv(base / "run", base / "prep", f"--data.dataset={src}",
                                                    "--train.max_iters=4"), capsys)
    line = an_error_line(code, err, f"data.dataset {str(src)!r}", "changed since the checkpoint",
                           "put the original data back", "new --train.out_dir")
    assert "malformed" not in line and snapshot(base / "prep") == before and "rebuilding" not in err


def test_putting_the_original_data_back_resumes_the_run(resumable, capsys):
    """The line's first fix works: the refused rerun kept the checkpoint's tokens, and with the source as it
    was the same command resumes from the checkpoint."""
    base, pristine = resumable
    shutil.rmtree(base)
    shutil.copytree(pristine, base)
    src = base / "mini.txt"
    argv = train_argv(base / "run", base / "prep", f"--data.dataset={src}", "--train.max_iters=4")
    src.write_text(MINI + "an edit\n", encoding="utf-8")
    an_error_line(*run_entry(train_cli.main, argv, capsys)[::2], "changed since the checkpoint")
    src.write_text(MINI, encoding="utf-8")
    with contextlib.redirect_stdout(io.StringIO()):
        summary = loop.train(load_config(argv))
    assert summary["iter"] == 4 and min(summary["losses"]) >= 2  # resumed at 2: no loss logged before it


@settings(max_examples=8)  # each loads the model's checkpoint; every kind and every name comes up
@given(blocked=st.sampled_from(["attention.png", "surprisal.png", "surprisal.html", "attention_L0.png"]),
       kind=st.sampled_from(["folder", "loop", "link into nowhere", "fifo nobody reads"]))
def test_an_inspect_output_that_cannot_be_written_is_named_before_anything_is_written(world, tmp_path_factory, capsys,
                                                                                      blocked, kind):
    # found from outside: a surprisal.html that was a folder was refused only after attention.png and
    # surprisal.png had replaced the earlier ones, and the line named --out as if it were that file
    from eval.inspect import main as inspect_main

    out = tmp_path_factory.mktemp("inspect")
    target = out / blocked
    if kind == "folder":
        target.mkdir()
    elif kind == "loop":
        target.symlink_to(out / "other")
        (out / "other").symlink_to(target)
    elif kind == "link into nowhere":
        target.symlink_to(out / "missing" / "x.png")
    else:
        os.mkfifo(target)
    before = sorted(p.name for p in out.iterdir())
    code, _, err = run_entry(inspect_main, ["--checkpoint", world.ckpt, "--text", "To be, or not", "--out", out,
                                            "--layer", "0"], capsys)
    line = an_error_line(code, err, f"--out {out}: {blocked}")
    assert ("start its reader first" if kind == "fifo nobody reads" else "choose another --out") in line, line
    assert sorted(p.name for p in out.iterdir()) == before, line  # nothing written, nothing replaced
