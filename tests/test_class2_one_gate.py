"""Class 2 (docs/reliability.md): every writer goes through the one gate, ownership.check_output. Each
entry point that writes (tests/entry_points.py's WRITERS) is pointed into each kind of folder another
command manages (a training out_dir, an HF export, a prepared data folder, a sharded checkpoint): one
`error:` line naming the folder and "a folder has one owner", exit 2, and every file there keeps its bytes."""
from __future__ import annotations

import dataclasses
import errno
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eval.inspect as inspect_cli
import ownership
from data import tasks as tasks_cli
from training import plot as plot_cli
from entry_points import NOT_ENTRY_POINTS, PARSERS, WRITERS, run_entry
from errors import UserError
from fileio import no_empty_dirs_left
from managed_folders import make_managed, KINDS


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def scripts(root: Path) -> set[str]:
    """The product's modules with a `__main__` block (what a user can run), as entry_points names them."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ("tests", ".anchors") or 'if __name__ == "__main__"' not in path.read_text(encoding="utf-8"):
            continue
        module = ".".join(rel.with_suffix("").parts)
        found.add(str(rel) if len(rel.parts) == 1 or rel.parts[0] == "benchmarks" else
                  f"python -m {module.removesuffix('.__main__')}")
    return found


def test_class2_every_script_is_an_entry_point_the_classes_cover_or_says_why_not():
    """python -m data.tasks wrote into a training out_dir: it was no row of PARSERS or WRITERS, so no class test
    ever ran it. Every module a user can run is listed, or named with the reason it is not."""
    root = Path(__file__).resolve().parents[1]
    listed = set(PARSERS) | set(NOT_ENTRY_POINTS)
    assert scripts(root) - listed == set(), "entry points no class test covers: add them to tests/entry_points.py"
    assert listed - scripts(root) == set(), "rows for scripts that are gone"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("writer", WRITERS, ids=str)
def test_class2_every_writer_refuses_an_output_inside_a_folder_another_command_manages(writer, kind, world, capsys,
                                                                                      tmp_path):
    folder = make_managed(kind, tmp_path / "managed")
    before = snapshot(folder)
    out = folder / (writer.file_name if writer.makes == "file" else "out_folder")
    code, _, err = run_entry(writer.main, writer.argv(out, world), capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert str(folder) in lines[0] and "a folder has one owner" in lines[0], lines[0]
    assert snapshot(folder) == before


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("writer", [w for w in WRITERS if w.makes == "folder"], ids=str)
def test_class2_a_folder_writer_refuses_a_folder_another_command_manages(writer, kind, world, capsys, tmp_path):
    if writer.manages == kind:
        pytest.skip("the writer's own kind: it writes there (its own tests)")
    folder = make_managed(kind, tmp_path / "managed")
    before = snapshot(folder)
    code, _, err = run_entry(writer.main, writer.argv(folder, world), capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert str(folder) in lines[0], lines[0]
    assert snapshot(folder) == before


def test_class2_inspect_into_the_ckpt_dcp_it_reads_is_refused(world, capsys, tmp_path):
    """The issue's example: `python -m eval.inspect --out` wrote its pictures into the ckpt.dcp it read."""
    run = tmp_path / "run"
    shutil.copytree(world.run, run)
    before = snapshot(run)
    for out in (run / "ckpt.dcp", run / "ckpt.dcp" / "pictures", run):
        code, _, err = run_entry(inspect_cli.main, ["--checkpoint", run / "ckpt.dcp", "--text", "hear", "--out", out],
                                 capsys)
        assert code == 2 and err.count("error: ") == 1 and "a folder has one owner" in err, err
    assert snapshot(run) == before


def test_class2_the_gate_lets_a_users_own_folder_and_file_through(tmp_path):
    """Not everything is refused: a new file, a file in a plain folder, a folder of the user's."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    for path in (tmp_path / "new.txt", tmp_path / "mine" / "samples.txt", tmp_path / "mine"):
        assert ownership.check_output(str(path), "--out") == path
    with pytest.raises(UserError, match="a folder has one owner"):
        ownership.check_output(str(make_managed(ownership.DATA, tmp_path / "d") / "x"), "--out")


# What makes each writer refuse after it has made its output folder: its inputs broken (a checkpoint of
# junk, a corpus that is not text, a data root that is a file), or an option that conflicts with another
NEEDS_MORE = {"bench.py --json": ["--nanogpt-dir", "x"]}  # refused after --json is checked: it needs --only train
READS_NOTHING = {"data.tasks --out"}  # nothing to break: every option is refused before its folder is made


@pytest.mark.parametrize("writer", [w for w in WRITERS if (w.makes == "folder" and w.name not in READS_NOTHING)
                                    or w.name == "bench.py --json"], ids=str)
def test_class2_a_refused_writer_leaves_no_folder_it_made(writer, world, capsys, tmp_path):
    """train.py's out_dir and eval.inspect's --out were made before a bad checkpoint was refused, and left
    behind empty (fileio.no_empty_dirs_left): a refusal leaves nothing behind, the missing parents included."""
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "ckpt.pt").write_bytes(b"not a checkpoint")
    (junk / "corpus.txt").write_bytes(b"\xff\xfe\x00 not text")
    (junk / "root").write_text("a file where a folder should be")
    broken = dataclasses.replace(world, run=junk, ckpt=junk / "ckpt.pt", gpt2=junk / "ckpt.pt",
                                 corpus=junk / "corpus.txt", data_root=junk / "root")
    made = tmp_path / "new" / "deeper"
    out = made / ("out.json" if writer.makes == "file" else "out")
    code, _, err = run_entry(writer.main, [*writer.argv(out, broken), *NEEDS_MORE.get(writer.name, [])], capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert not (tmp_path / "new").exists(), (lines, sorted(p.name for p in made.rglob("*")))


PARTS = ["a", "b", "keep", "new", "new2", "..", ".", "ln", "dead", "file", "loop"]


@settings(max_examples=60)
@given(st.lists(st.sampled_from(PARTS), min_size=1, max_size=5), st.sampled_from(["absolute", "relative", "home"]),
       st.sampled_from(["os.makedirs", "Path.mkdir"]), st.booleans())
def test_class2_no_empty_dirs_left_removes_what_making_a_path_made_and_nothing_else(parts, start, maker, write):
    """Any path made of existing folders, missing ones, "..", ".", a link to a folder, a dangling link, a link
    loop and a file, given absolute, relative or from ~: made (os.makedirs, or Path.mkdir as check_writable_dir
    does) inside the block, then left by an exception. Every folder that was there stays; every folder the
    making made is gone, unless something was written into it."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "a" / "b").mkdir(parents=True)
        (base / "keep").mkdir()
        (base / "file").write_text("a file")
        (base / "ln").symlink_to(base / "a" / "b")
        (base / "dead").symlink_to(base / "nowhere")
        (base / "loop").symlink_to(base / "loop")
        before = {p for p in base.rglob("*")}
        cwd, home = os.getcwd(), os.environ.get("HOME")
        os.chdir(base)
        os.environ["HOME"] = str(base / "a")
        try:
            path = {"absolute": base.joinpath(*parts), "relative": Path(*parts), "home": Path("~", *parts)}[start]
            with pytest.raises(RuntimeError), no_empty_dirs_left(path):
                made = Path(os.path.expanduser(path))
                try:
                    if maker == "os.makedirs":
                        os.makedirs(made, exist_ok=True)
                    else:
                        made.mkdir(parents=True, exist_ok=True)
                    if write and made.is_dir():
                        (made / "written").write_text("a command's output")
                except OSError:
                    pass  # through a file, a dangling link or a loop: made partway, or not at all
                raise RuntimeError("refused")
        finally:
            os.chdir(cwd)
            if home is None:
                del os.environ["HOME"]
            else:
                os.environ["HOME"] = home
        after = {p for p in base.rglob("*")}
        assert before <= after, before - after
        kept = {p for p in after - before if p.name != "written"}
        assert all(any(p in q.parents or p == q.parent for q in after - before if q.name == "written") for p in kept), \
            sorted(map(str, after - before))


# Class 2's second half: an output name that already holds a user's file. What each writer does there, one row
# each (a new writer adds its row):
# - NAMED: the user named that very file as the output, which is replaced as asked (atomically, and never an
#   input: check_output_not_input); the files beside it are untouched;
# - (REFUSED, names): the names it picks itself in the folder the user gave; a user's file at any of them is
#   refused in one line naming it, before anything is written (ownership.check_replaceable: only what it wrote
#   there itself, as recorded, or the very bytes, is replaced; an out_dir and an export have their own rules);
# - (KEPT, names): a user's folder at the name of the folder it writes: written beside the user's files, never
#   over them (data.prepare's shards and manifest have names of their own: a hash of their source).
NAMED, REFUSED, KEPT = "named", "refused", "kept"
USER_FILES = {
    "sample.py --out": NAMED,
    "eval.inspect --out": (REFUSED, ("attention.png", "surprisal.png", "surprisal.html")),
    "training.plot --out": (REFUSED, ("curves.png",)),  # --out a folder (or figs/): curves.png in it
    "bench.py --json": NAMED,
    "checkpoint consolidate --out": NAMED,
    "checkpoint.export --out": (REFUSED, ("config.json", "model.safetensors", "README.md")),  # any file: refused
    "data.prepare --root": (KEPT, ("corpus-9c4fae06-char",)),  # the world's corpus, char: its folder's name
    "data.tasks --out": (REFUSED, ("train.jsonl", "heldout.jsonl", "pretrain.txt")),
    "train.py train.out_dir": (REFUSED, ("metrics.jsonl",)),  # a log and no checkpoint: no run's, refused
}


def test_class2_the_user_files_table_has_a_row_for_every_writer():
    assert set(USER_FILES) == {w.name for w in WRITERS}


@pytest.mark.parametrize("writer", [w for w in WRITERS if USER_FILES[w.name] != NAMED], ids=str)
def test_class2_a_writer_never_replaces_a_users_file_at_a_name_it_picks(writer, world, capsys, tmp_path):
    """python -m data.tasks --out F replaced the train.jsonl and pretrain.txt the user had in F. Every name each
    writer picks in the user's folder, holding the user's bytes (a folder of the user's where it writes a folder):
    REFUSED, one line naming the file, exit 2, and every file in the folder as it was (no marker left either);
    KEPT, every file of the user's keeps its bytes."""
    rule, names = USER_FILES[writer.name]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    for name in names:
        if rule == REFUSED:
            (mine / name).write_bytes(b"the user's own " + name.encode())
        else:
            (mine / name).mkdir()
            (mine / name / "notes.txt").write_text("the user's own folder")
    before = snapshot(mine)
    code, _, err = run_entry(writer.main, writer.argv(mine, world), capsys)
    if rule == KEPT:
        assert code == 0, err
        after = snapshot(mine)
        assert {k: v for k, v in after.items() if k in before} == before
        return
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert names[0] in lines[0], lines[0]  # the file's own name (export: among the files it found there)
    assert snapshot(mine) == before


@pytest.mark.parametrize("writer", [w for w in WRITERS if w.name in ("data.tasks --out", "eval.inspect --out",
                                                                      "training.plot --out")], ids=str)
def test_class2_a_writer_replaces_what_it_wrote_itself(writer, world, capsys, tmp_path):
    """Not everything is refused: its own files from an earlier run (recorded) are replaced; the user's stay."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    for _ in range(2):
        code, _, err = run_entry(writer.main, writer.argv(mine, world), capsys)
        assert code == 0, err
    assert (mine / "notes.txt").read_text() == "the user's"


@pytest.mark.parametrize("writer", [w for w in WRITERS if USER_FILES[w.name] == NAMED], ids=str)
def test_class2_a_file_the_user_named_is_the_output(writer, world, capsys, tmp_path):
    """A file writer given the file itself writes it, as asked; the files beside it keep their bytes."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    out = mine / ("one.pt" if "consolidate" in writer.name else writer.file_name)
    out.write_bytes(b"old")
    code, _, err = run_entry(writer.main, writer.argv(out, world), capsys)
    assert code == 0, err
    assert out.read_bytes() != b"old" and (mine / "notes.txt").read_text() == "the user's"


# The record of what a writer wrote in a user's folder (ownership.WRITTEN): kept up to date by every write that
# replaces one of its files, written file by file, bounded, and a failure to write it is one line.
def test_class2_plot_a_file_named_then_the_folder_replaces_its_own_picture(world, capsys, tmp_path):
    """`plot r --out p/` (recorded), `plot r --out p/curves.png` (a new picture: the record was left with the old
    digest), then `plot r --out p/` refused its own curves.png as "a file this command did not write there"."""
    mine = tmp_path / "mine"
    mine.mkdir()
    for argv in ([world.run, "--out", f"{mine}/"], [world.run, "--out", mine / "curves.png", "--log-scale"],
                 [world.run, "--out", f"{mine}/"]):
        before = (mine / "curves.png").read_bytes() if (mine / "curves.png").exists() else None
        code, _, err = run_entry(plot_cli.main, argv, capsys)
        assert code == 0, err
        assert (mine / "curves.png").read_bytes() != before


@pytest.mark.parametrize("spelling", ["./mine/c.png", "mine//c.png", "mine/../mine/c.png"])
def test_class2_plot_a_file_the_user_named_in_any_spelling_is_the_output(spelling, world, capsys, tmp_path, monkeypatch):
    """Picked or named was decided by comparing spellings (str(out) != args.out): `./c.png` counted as a name the
    command picked, so the user's file at it was refused, the message naming `--out .`."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "c.png").write_bytes(b"the user's old picture")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_entry(plot_cli.main, [world.run, "--out", spelling], capsys)
    assert code == 0, err
    assert (mine / "c.png").read_bytes().startswith(b"\x89PNG")
    assert plot_cli.resolve_output(spelling, [world.run]) == (Path(spelling), False)
    assert plot_cli.resolve_output("mine/", [world.run]) == (Path("mine/curves.png"), True)
    assert plot_cli.resolve_output("mine/c", [world.run]) == (Path("mine/c.png"), True)


def failing_write(module, monkeypatch, at: int):
    """`module`'s atomic_write_bytes, failing with a full disk at its `at`-th call (1 = the first)."""
    calls, real = [], module.atomic_write_bytes

    def write(*a, **k):
        calls.append(a[0])
        if len(calls) == at:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(module, "atomic_write_bytes", write)


@pytest.mark.parametrize("writer", ["training.plot --out", "eval.inspect --out", "data.tasks --out"])
def test_class2_a_failure_to_write_the_record_is_one_line(writer, world, capsys, tmp_path, monkeypatch):
    """training.plot wrote its record outside plot()'s OSError handler: a full disk there was a traceback."""
    mine = tmp_path / "mine"
    mine.mkdir()
    w = next(w for w in WRITERS if w.name == writer)
    failing_write(ownership, monkeypatch, 1)
    code, _, err = run_entry(w.main, w.argv(mine if writer != "training.plot --out" else f"{mine}/", world), capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert ownership.WRITTEN in lines[0] and "space" in lines[0], lines[0]


@pytest.mark.parametrize("writer", ["eval.inspect --out", "data.tasks --out"])
@pytest.mark.parametrize("at", [2, 3])
def test_class2_a_rerun_after_a_failed_write_replaces_what_was_written(writer, at, world, capsys, tmp_path,
                                                                     monkeypatch):
    """The record was written once every file was: a full disk at the third left the first two replaced and
    unrecorded, and every later run refused them as the user's."""
    module, argv = {
        "eval.inspect --out": (inspect_cli, lambda o, n: ["--checkpoint", world.ckpt, "--text", "hear me " * n,
                                                          "--out", o]),
        "data.tasks --out": (tasks_cli, lambda o, n: ["--out", o, "--train", "2", "--heldout", "0",
                                                      "--pretrain-lines", "0", "--seed", str(n)]),
    }[writer]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    code, _, err = run_entry(module.main, argv(mine, 1), capsys)
    assert code == 0, err
    with monkeypatch.context() as m:
        failing_write(module, m, at)
        code, _, err = run_entry(module.main, argv(mine, 2), capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code != 0 and len(lines) == 1 and "Traceback" not in err, err
    code, _, err = run_entry(module.main, argv(mine, 3), capsys)
    assert code == 0, err
    assert (mine / "notes.txt").read_text() == "the user's"


def test_class2_a_record_past_the_old_bound_is_read_and_pruned(world, capsys, tmp_path):
    """The record only grew (indent=1, ~110 bytes an entry, never pruned): past 64 KiB every later run was refused
    as "not a record this project wrote". Entries whose file is gone are dropped at the next write."""
    mine = tmp_path / "mine"
    mine.mkdir()
    gone = {f"attention_L{i}_H{i}.png": [1000 + i, "0" * 64] for i in range(1000)}
    (mine / ownership.WRITTEN).write_text(json.dumps({"written": gone}, indent=1) + "\n")
    assert (mine / ownership.WRITTEN).stat().st_size > 64 << 10
    code, _, err = run_entry(tasks_cli.main, ["--out", mine, "--train", "2", "--heldout", "0", "--pretrain-lines", "0"],
                             capsys)
    assert code == 0, err
    record = json.loads((mine / ownership.WRITTEN).read_text())["written"]
    assert set(record) == {"train.jsonl", "heldout.jsonl", "pretrain.txt"}
    assert (mine / ownership.WRITTEN).stat().st_size < 1000


def test_class2_a_record_over_the_bound_is_said_too_large_not_foreign(tmp_path):
    (tmp_path / ownership.WRITTEN).write_bytes(b" " * (ownership.WRITTEN_MAX + 1))
    with pytest.raises(UserError) as e:
        ownership.check_replaceable(tmp_path, ("c.png",), "--out")
    assert "too large" in str(e.value) and "remove it" in str(e.value) and "not a record" not in str(e.value)
