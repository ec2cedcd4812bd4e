"""Prepared data is never lost or silently wrong: a prepare killed mid-write leaves nothing behind for
long, two prepares of one directory take turns, a touched source is no change, and every half-valid
prepared directory or unusable data.root is one line."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import data.build
import data.shards
from data import BatchLoader, DataConfig, load_meta, prepare_data
from errors import UserError
from locks import DirLock
from prepared_files import first_file
import warm_runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text("To be, or not to be, that is the question.\n" * 200, encoding="utf-8")
    return path


def cfg(source: Path, root: Path, **kw) -> DataConfig:
    return DataConfig(dataset=str(source), tokenizer="char", root=str(root), **kw)


def temps(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob(".*.tmp"))


# ------------------------------------------------------------------------------------------ killed, concurrent

def jsonl_corpus(root: Path, files: int = 4, rows: int = 60) -> Path:
    """A folder of JSON Lines files of numbered sentences: thousands of tokens, many documents."""
    root.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        lines = [json.dumps({"id": r, "text": f"Document {f}-{r}: " + "the quick brown fox jumps. " * (1 + r % 7)})
                 for r in range(rows)]
        (root / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def files_of(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and not p.name.startswith(".")}


KILL_MID_SHARD = """
real_write, written = data.shards._Split.write, [0]
def write(self, ids):  # SIGKILL once 3.5 shards' worth of tokens went out: in the middle of a shard
    written[0] += len(ids)
    if written[0] >= 2450:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_write(self, ids)
data.shards._Split.write = write
"""
KILL_AFTER_A_SHARD = """
real_finish = data.shards._Split.finish_shard
def finish_shard(self):  # SIGKILL just after the third train shard is renamed, before the state is recorded
    real_finish(self)
    if self.name == "train" and len(self.shards) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
data.shards._Split.finish_shard = finish_shard
"""


@pytest.mark.parametrize("kill", [KILL_MID_SHARD, KILL_AFTER_A_SHARD], ids=["mid-shard", "after-a-shard"])
def test_a_prepare_killed_mid_shard_resumes_and_ends_byte_equal_to_an_uninterrupted_one(tmp_path, kill, monkeypatch):
    corpus = jsonl_corpus(tmp_path / "corpus")
    settings = dict(dataset=str(corpus), tokenizer="gpt2", val_fraction=0.2, shard_tokens=700, num_proc=2)
    whole = prepare_data(DataConfig(root=str(tmp_path / "whole"), **settings), progress=False)
    assert len(json.loads((whole / "meta.json").read_text())["shards"]["train"]) > 4
    root = tmp_path / "killed"
    child = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        import data.shards
        from data import DataConfig, prepare_data
    """) + kill + textwrap.dedent(f"""
        prepare_data(DataConfig(root={str(root)!r}, **{settings!r}), progress=False)
    """)
    r = warm_runs.run(["-c", child])
    assert r.returncode == -9, r.stderr
    out = root / whole.name
    assert not (out / "meta.json").exists()
    (record,) = out.glob(".prepare-*.json")  # what the killed prepare recorded as finished
    recorded = [sh["name"] for st in json.loads(record.read_text())["splits"].values() for sh in st["shards"]]
    kept = {name: (out / name).stat().st_mtime_ns for name in recorded}
    assert len(kept) >= 2  # finished shards survived the kill
    import io
    from contextlib import redirect_stderr

    hashed, real_digest = [], hashlib.file_digest

    def file_digest(f, digest):
        hashed.append(Path(f.name))
        return real_digest(f, digest)

    monkeypatch.setattr(hashlib, "file_digest", file_digest)
    err = io.StringIO()
    with redirect_stderr(err):
        assert prepare_data(DataConfig(root=str(root), **settings), progress=True) == out
    assert not [p for p in hashed if p.is_relative_to(corpus)]  # the resume did not read the corpus to hash it
    assert f"{len(kept)} finished shard(s) kept" in err.getvalue()
    assert files_of(out) == files_of(whole)
    assert all((out / name).stat().st_mtime_ns == t for name, t in kept.items())  # kept, not written again
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) in ([], [".readers"])



def test_a_prepare_killed_inside_its_only_shard_resumes_from_its_last_record(tmp_path):
    # One big shard: no shard is ever finished before the kill, so only the timed records (here one at every
    # document start: RECORD_EVERY_S = 0) keep work; the resume must start past the beginning and still end
    # byte-equal to an uninterrupted prepare.
    corpus = jsonl_corpus(tmp_path / "corpus")
    settings = dict(dataset=str(corpus), tokenizer="gpt2", val_fraction=0.2, shard_tokens=10**6, num_proc=2)
    whole = prepare_data(DataConfig(root=str(tmp_path / "whole"), **settings), progress=False)
    root = tmp_path / "killed"
    child = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        import data.shards
        from data import DataConfig, prepare_data
        data.shards.RECORD_EVERY_S = 0
    """) + KILL_MID_SHARD + textwrap.dedent(f"""
        prepare_data(DataConfig(root={str(root)!r}, **{settings!r}), progress=False)
    """)
    r = warm_runs.run(["-c", child])
    assert r.returncode == -9, r.stderr
    out = root / whole.name
    (record,) = out.glob(".prepare-*.json")
    state = json.loads(record.read_text())
    assert state["pos"] != [0, 0] and state["splits"]["train"]["partial"] > 1000  # recorded mid-shard
    assert prepare_data(DataConfig(root=str(root), **settings), progress=False) == out
    assert files_of(out) == files_of(whole)

def test_a_second_prepare_of_the_same_directory_waits_for_the_first(source, tmp_path):
    root = tmp_path / "prepared"
    out = prepare_data(cfg(source, root), progress=False)
    (out / "meta.json").unlink()  # force a rebuild
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from locks import DirLock
        lock = DirLock({str(out)!r}, ".prepare.lock")
        assert lock.try_acquire() is None
        print("locked", flush=True)
        time.sleep(1.5)
        lock.release()
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    t0 = time.perf_counter()
    prepare_data(cfg(source, root), progress=False)
    assert time.perf_counter() - t0 > 1.0  # it waited for the live holder
    holder.wait()
    assert load_meta(out)["splits"]["train"]["tokens"] > 0


def test_processes_racing_for_a_lock_never_hold_it_together(tmp_path):
    """Two trainers started at once on a missing prepared dir both built it, into the same files: one took
    the lock file the other had just created but not yet written, read it as torn, hence stale, and
    took it over. Four processes racing for one lock: whoever holds it creates a marker with O_EXCL,
    which fails if another holder's marker is there."""
    child = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from locks import DirLock
        d = {str(tmp_path)!r}
        lock, taken, end = DirLock(d, ".race.lock"), 0, time.time() + 0.5
        while time.time() < end:
            if lock.try_acquire() is not None:
                continue
            try:
                fd = os.open(os.path.join(d, "held"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                print("overlap", flush=True)
                raise SystemExit(1)
            os.close(fd)
            taken += 1
            os.unlink(os.path.join(d, "held"))
            lock.release()
        print(taken)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(o.isdigit() for o in outs), outs  # no process ever found another holder's marker
    assert sum(map(int, outs)) > 20 and not (tmp_path / ".race.lock").exists()


def test_a_lock_on_a_filesystem_without_hard_links_is_still_taken_over_when_stale(tmp_path, monkeypatch):
    """Where os.link fails (FAT, some FUSE mounts), the lock file is created with O_EXCL instead; a stale one
    (its owner dead) must still be taken over, a live one reported, and only our own removed on release."""
    import socket

    import fileio

    def no_links(*a, **k):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(fileio.os, "link", no_links)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = tmp_path / ".x.lock"
    path.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    lock = DirLock(tmp_path, ".x.lock")
    assert lock.try_acquire() is None and json.loads(path.read_text())["pid"] == os.getpid()
    assert DirLock(tmp_path, ".x.lock").try_acquire()["pid"] == os.getpid()  # held: reported, not taken
    lock.release()
    assert not path.exists()
    assert lock.try_acquire() is None  # a fresh one, created with O_EXCL
    lock.release()
    assert not path.exists() and not list(tmp_path.glob(".*.tmp"))


def test_a_lock_left_by_a_dead_process_does_not_block(source, tmp_path):
    root = tmp_path / "prepared"
    out = prepare_data(cfg(source, root), progress=False)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    (out / ".prepare.lock").write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    (out / "meta.json").unlink()
    t0 = time.perf_counter()
    prepare_data(cfg(source, root), progress=False)
    assert time.perf_counter() - t0 < 5 and load_meta(out)


# ------------------------------------------------------------------------------------------ fingerprints

def test_touching_the_source_rebuilds_nothing_and_an_edit_is_a_new_dataset(source, tmp_path, capsys):
    root = tmp_path / "prepared"
    out = prepare_data(cfg(source, root), progress=False)
    state = BatchLoader(out, "train", block_size=8, batch_size=2, seed=0).state_dict()
    meta_before = (out / "meta.json").read_bytes()
    st = source.stat()
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touch: same bytes, new time
    prepare_data(cfg(source, root), progress=True)
    assert "up to date" in capsys.readouterr().err
    BatchLoader(out, "train", block_size=8, batch_size=2, seed=0).load_state_dict(state)  # resumes fine
    source.write_text(source.read_text().replace("question", "Question"), encoding="utf-8")  # a real edit
    prepare_data(cfg(source, root), progress=True)
    assert "rebuilding" in capsys.readouterr().err and (out / "meta.json").read_bytes() != meta_before
    with pytest.raises(UserError, match=r"trained on different data") as e:
        BatchLoader(out, "train", block_size=8, batch_size=2, seed=0).load_state_dict(state)
    assert "\n" not in str(e.value)


def test_prepare_data_owns_the_resumed_runs_tokens_before_and_after_preparing(source, tmp_path):
    """`resumes`: the dir holding the run's tokens is not rebuilt when the source changed (one line, the dir
    as it was), and a dir prepared anew since (other tokens) is refused by prepare_data itself, one line."""
    root = tmp_path / "prepared"
    out = prepare_data(cfg(source, root), progress=False)
    trained_on = load_meta(out)["tokens_sha256"]
    source.write_text(source.read_text() + "an edit\n", encoding="utf-8")
    before = (out / "meta.json").read_bytes()
    with pytest.raises(UserError, match=r"changed since the checkpoint ck\.pt") as e:
        prepare_data(cfg(source, root), progress=False, resumes=("ck.pt", trained_on))
    assert "\n" not in str(e.value) and (out / "meta.json").read_bytes() == before
    prepare_data(cfg(source, root), progress=False)  # prepared anew, without a resume
    with pytest.raises(UserError, match=r"changed since the checkpoint ck\.pt.*put the original data back") as e:
        prepare_data(cfg(source, root), progress=False, resumes=("ck.pt", trained_on))
    assert "\n" not in str(e.value) and trained_on[:12] in str(e.value)


def test_an_unchanged_big_source_is_not_read_again_to_fingerprint_it(source, tmp_path, monkeypatch):
    root = tmp_path / "prepared"
    prepare_data(cfg(source, root), progress=False)
    opened = []
    real_open = open

    def spying_open(path, *a, **k):
        opened.append(str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", spying_open)
    prepare_data(cfg(source, root), progress=False)
    assert str(source.resolve()) not in opened  # size and mtime unchanged: the stored hash is used


# ------------------------------------------------------------------------------------------ half-valid dirs

@pytest.fixture
def prepared(source, tmp_path) -> Path:
    return prepare_data(cfg(source, tmp_path / "prepared"), progress=False)


def edit_meta(out: Path, change) -> None:
    meta = json.loads((out / "meta.json").read_text())
    change(meta)
    (out / "meta.json").write_text(json.dumps(meta))


def test_a_token_id_beyond_vocab_size_is_one_line(prepared):
    meta = load_meta(prepared)
    tokens = np.fromfile(first_file(prepared, "train"), dtype=meta["dtype"])
    tokens[100] = meta["vocab_size"] + 3  # a damaged file
    tokens.tofile(first_file(prepared, "train"))
    with pytest.raises(UserError, match=rf"holds token id {meta['vocab_size'] + 3}, but meta.json says vocab_size"):
        BatchLoader(prepared, "train", block_size=8, batch_size=2, seed=0)


def test_a_lowered_vocab_size_in_meta_is_one_line(prepared):
    edit_meta(prepared, lambda m: m.update(vocab_size=5, chars=None, tokenizer="gpt2"))
    with pytest.raises(UserError, match="but meta.json says vocab_size 5"):
        BatchLoader(prepared, "train", block_size=8, batch_size=2, seed=0)


def test_a_large_file_is_range_checked_by_sampling_and_finds_a_damaged_region(prepared, monkeypatch):
    import data.loader

    monkeypatch.setattr(data.loader, "CHECK_ALL", 100)  # pretend the split is large
    monkeypatch.setattr(data.loader, "CHECK_BLOCK", 16)
    meta = load_meta(prepared)
    tokens = np.fromfile(first_file(prepared, "train"), dtype=meta["dtype"])
    tokens[len(tokens) // 2 - 4000:len(tokens) // 2 + 4000] = 60000  # a damaged region
    tokens.tofile(first_file(prepared, "train"))
    with pytest.raises(UserError, match="holds token id 60000"):
        BatchLoader(prepared, "train", block_size=8, batch_size=2, seed=0)


def test_zero_bytes_for_a_split_with_tokens_is_one_line(prepared):
    edit_meta(prepared, lambda m: m["splits"]["val"].update(bytes=0))
    with pytest.raises(UserError, match=r"val split's \d+ tokens stand for 0 bytes"):
        load_meta(prepared)


@pytest.mark.parametrize("change", [
    lambda m: m.update(chars=m["chars"][1:]),  # a character lost
    lambda m: m.update(vocab_size=m["vocab_size"] + 1),
    lambda m: m.update(eot=0),
])
def test_a_char_vocabulary_that_does_not_match_vocab_size_is_one_line(prepared, change):
    edit_meta(prepared, change)
    with pytest.raises(UserError, match="char vocabulary does not match its vocab_size"):
        load_meta(prepared)


# a prepared folder of a trained tokenizer and no tokens (load_meta reads the tokenizer's file last)
BPE_META = {"format_version": 2, "tokenizer": "bpe:512", "vocab_size": 512, "eot": 511, "dtype": "uint16",
            "chars": None, "fingerprint": "f", "tokens_sha256": "t", "tokenizer_file": "tokenizer-abc.json",
            "splits": {s: {"tokens": 0, "bytes": 0} for s in ("train", "val")}, "shards": {"train": [], "val": []}}


@pytest.mark.parametrize("name", ["../outside.json", "/etc/hostname", "..", ".", "", "a\0b"])
def test_a_file_name_in_meta_that_is_no_name_in_the_folder_is_one_line(prepared, tmp_path, name):
    """meta.json's file names (a shard's, the trained tokenizer's) are names inside the folder: the shards' were
    checked for "/" only (".." was "is not a file"), the tokenizer's not at all (`../x` was read, whole)."""
    (prepared.parent / "outside.json").write_text("{}")
    edit_meta(prepared, lambda m: m["shards"]["train"][0].update(name=name))
    with pytest.raises(UserError, match="missing fields or has wrong types"):
        load_meta(prepared)
    bpe = tmp_path / "bpe"
    bpe.mkdir()
    (bpe / "meta.json").write_text(json.dumps({**BPE_META, "tokenizer_file": name}))
    with pytest.raises(UserError, match="missing fields or has wrong types"):
        load_meta(bpe)


# ------------------------------------------------------------------------------------------ filesystem

def test_a_data_root_that_is_a_file_or_unwritable_is_one_line_before_any_work(source, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"data.root=.*file is a file, not a directory"):
        prepare_data(cfg(source, tmp_path / "file"), progress=False)
    with pytest.raises(UserError, match=r"data.root=.* lies under a file"):
        prepare_data(cfg(source, tmp_path / "file" / "sub"), progress=False)
    import fileio

    def read_only(final):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(fileio, "temp_path", read_only)  # what an unwritable directory does (tests run as root)
    monkeypatch.setattr(data.build, "open_source", lambda c: pytest.fail("work started before the check"))
    with pytest.raises(UserError, match=r"data.root=.* is not writable \(PermissionError"):
        prepare_data(cfg(source, tmp_path / "ro"), progress=False)


@pytest.mark.parametrize("code, advice", [(errno.ENOSPC, "free some space or set data.root"),
                                          (errno.ENOENT, "; set data.root to another disk")])
def test_a_failed_write_during_prepare_is_one_line_and_keeps_the_old_data(prepared, source, tmp_path, monkeypatch,
                                                                          code, advice):
    """A full disk, and a write error that is not about space (advised "free some space" before)."""
    before = {p.name: p.read_bytes() for p in prepared.iterdir()}
    source.write_text(source.read_text() + "more\n", encoding="utf-8")  # a change: prepare rebuilds

    def failed(*a, **k):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(data.shards._Split, "finish_shard", failed)
    with pytest.raises(UserError, match=r"cannot write prepared data in .*" + os.strerror(code) + ".*previous data") as e:
        prepare_data(cfg(source, tmp_path / "prepared"), progress=False)
    assert "\n" not in str(e.value) and advice in str(e.value)
    assert (code == errno.ENOSPC) == ("space" in str(e.value))
    assert {p.name: p.read_bytes() for p in prepared.iterdir()} == before  # and nothing of the failed build left
    assert temps(prepared) == []


def test_a_file_whose_name_has_brackets_is_used_as_is(tmp_path):
    path = tmp_path / "notes [draft].txt"
    path.write_text("brackets are not a pattern here\n" * 20, encoding="utf-8")
    out = prepare_data(cfg(path, tmp_path / "prepared"), progress=False)
    assert load_meta(out)["splits"]["train"]["tokens"] > 0


# ------------------------------------------------------------------------------------------ live readers, damage

def test_a_dir_read_by_a_live_training_run_is_not_rebuilt_under_it(prepared, source, tmp_path):
    from data import hold_data

    before = {p.name: p.read_bytes() for p in prepared.iterdir() if p.is_file()}
    release = hold_data(prepared, "the training run into out/x")
    source.write_text(source.read_text() + "an edit\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        prepare_data(cfg(source, tmp_path / "prepared"), progress=False)
    msg = str(e.value)
    assert "\n" not in msg and f"pid {os.getpid()}" in msg and "the training run into out/x" in msg, msg
    assert {p.name: p.read_bytes() for p in prepared.iterdir() if p.is_file()} == before
    release()
    prepare_data(cfg(source, tmp_path / "prepared"), progress=False)  # the run is over: rebuilt
    assert {p.name: p.read_bytes() for p in prepared.iterdir() if p.is_file()} != before


def test_a_reader_that_died_does_not_block_a_rebuild(prepared, source, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (prepared / ".readers").mkdir(exist_ok=True)
    import socket

    (prepared / ".readers" / "x.json").write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname(),
                                                              "what": "a run"}))
    source.write_text(source.read_text() + "an edit\n", encoding="utf-8")
    prepare_data(cfg(source, tmp_path / "prepared"), progress=False)
    assert not (prepared / ".readers" / "x.json").exists()


@pytest.mark.parametrize("damage", ["valid id", "out of range id"])
def test_damaged_tokens_are_found_at_start_and_rebuilt_by_prepare(prepared, source, tmp_path, capsys, damage):
    good = {p.name: p.read_bytes() for p in prepared.iterdir() if p.is_file()}
    shard = first_file(prepared, "train")
    tokens = np.fromfile(shard, dtype=np.uint16)
    tokens[7] = (tokens[7] + 1) % 5 if damage == "valid id" else 60000  # same size, one token changed
    tokens.tofile(shard)
    prepare_data(cfg(source, tmp_path / "prepared"), progress=True)
    err = capsys.readouterr().err
    assert f"rebuilding {prepared}: {shard.name}'s content differs from its checksum" in err and "up to date" not in err
    assert {p.name: p.read_bytes() for p in prepared.iterdir() if p.is_file()} == good


def test_a_large_corpus_is_checked_by_sampled_hashes(prepared, source, tmp_path, monkeypatch, capsys):
    import data.manifest

    monkeypatch.setattr(data.manifest, "VERIFY_ALL", 10)  # pretend the corpus is large
    monkeypatch.setattr(data.manifest, "file_sha256", lambda *a: pytest.fail("hashed every byte"))
    prepare_data(cfg(source, tmp_path / "prepared"), progress=True)
    assert "up to date" in capsys.readouterr().err
    shard = first_file(prepared, "train")
    shard.write_bytes(b"\x01\x00" * (shard.stat().st_size // 2))  # a damaged region (here: all of it)
    monkeypatch.undo()
    monkeypatch.setattr(data.manifest, "VERIFY_ALL", 10)
    prepare_data(cfg(source, tmp_path / "prepared"), progress=True)
    assert "differs from its sampled checksum" in capsys.readouterr().err
