"""Bad environments and inputs around the data, the launch and bench.py: each a one-line UserError that
names the problem and its fix (not a traceback, not another problem's fix), and nothing lost.

The bench.py options have their rows in tests/test_bench.py's table
(test_bench_options_are_checked_before_anything_is_measured)."""
from __future__ import annotations

import bz2
import errno
import gzip
import hashlib
import json
import lzma
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import data.formats
import data.pieces
from data import DataConfig, hold_data, prepare_data
from errors import UserError
from prepared_files import first_file
from runtime import choices
from cli_lines import an_error_line
from runtime.memory import check_fits
from training.parallel import distributed
from training.parallel.distributed import Parallel, dist_from_env
from training.report.wandb_logger import WANDB_DIR_VARIABLES, unusable_dir_variable

ROOT = Path(__file__).resolve().parents[1]

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def an_error_line(fn, *words: str) -> str:
    """Run fn, expect a one-line UserError with a fix after ';' that names `words`."""
    with pytest.raises(UserError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg and msg.partition(";")[2].strip(), msg
    for w in words:
        assert w in msg, f"{w!r} not in: {msg}"
    return msg


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _text(n_words: int = 6000) -> str:
    """Text that compresses poorly enough that half its compressed stream is a cut in the middle."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(500)]
    return " ".join(rng.choice(words) for _ in range(n_words))


def _body(kind: str) -> bytes:
    text = _text()
    if kind == "txt":
        return text.encode()
    docs = [{"text": text[i:i + 400]} for i in range(0, len(text), 400)]
    if kind == "jsonl":
        return "".join(json.dumps(d) + "\n" for d in docs).encode()
    return json.dumps(docs).encode()  # json: one array


def _compress(raw: bytes, suffix: str) -> bytes:
    if suffix == ".gz":
        return gzip.compress(raw)
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as f:
        f.write(raw)
    return sink.getvalue().to_pybytes()


# --- a damaged source is the source's problem, not data.root's --------------------------------------


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
@pytest.mark.parametrize("kind", ["txt", "jsonl", "json"])
def test_a_truncated_compressed_source_is_named_as_damaged_not_the_output_disk(tmp_path, kind, suffix):
    """Before: 'cannot write prepared data in ... (OSError: Truncated compressed stream); set data.root to
    another disk'."""
    whole = _compress(_body(kind), suffix)
    src = tmp_path / f"cut.{kind}{suffix}"
    src.write_bytes(whole[: len(whole) // 2])
    root = tmp_path / "prepared"
    cfg = DataConfig(dataset=str(src), tokenizer="char", root=str(root), val_fraction=0.5)
    tester = "gzip -t" if suffix == ".gz" else "zstd -t"
    msg = an_error_line(lambda: prepare_data(cfg, progress=False), str(src), "damaged", "cut short", "again", tester)
    assert "data.root" not in msg and "write" not in msg
    assert files_under(root) == {}  # nothing half-built left behind


def test_a_read_error_in_the_middle_of_a_source_blames_the_source_not_data_root(tmp_path, monkeypatch):
    """An I/O error (a bad disk, a parquet page that does not decompress) while the source is read."""
    src = tmp_path / "src.txt"
    src.write_text(_text(), encoding="utf-8")

    def failing(path, *args, **kwargs):
        yield data.pieces.Piece(True, "some text", 0, [0, 0], None)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(data.formats, "_text_pieces", failing)
    cfg = DataConfig(dataset=str(src), tokenizer="char", root=str(tmp_path / "prepared"))
    msg = an_error_line(lambda: prepare_data(cfg, progress=False), f"cannot read {src}", "damaged", "copy or download it again")
    assert "data.root" not in msg


def test_an_unreadable_source_file_says_fix_its_permissions_not_data_root(tmp_path, monkeypatch):
    src = tmp_path / "src.txt"
    src.write_text(_text(), encoding="utf-8")

    def refused(f, name):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(hashlib, "file_digest", refused)  # the first read of a source: hashing its content
    cfg = DataConfig(dataset=str(src), tokenizer="char", root=str(tmp_path / "prepared"))
    msg = an_error_line(lambda: prepare_data(cfg, progress=False), f"cannot read {src}", "fix its permissions")
    assert "data.root" not in msg


@pytest.mark.parametrize("suffix,compress", [(".bz2", bz2.compress), (".xz", lzma.compress)])
def test_a_source_compressed_in_a_format_that_is_not_read_is_refused_by_name(tmp_path, suffix, compress):
    """Before: 'is not UTF-8 text; convert it to UTF-8', the wrong fix."""
    src = tmp_path / f"src.txt{suffix}"
    src.write_bytes(compress(_text().encode()))
    cfg = DataConfig(dataset=str(src), tokenizer="char", root=str(tmp_path / "prepared"))
    msg = an_error_line(lambda: prepare_data(cfg, progress=False), str(src), "compressed", "decompress", ".gz and .zst")
    assert "UTF-8" not in msg


def test_compressed_data_in_a_file_named_as_text_is_named(tmp_path):
    src = tmp_path / "src.txt"
    src.write_bytes(gzip.compress(_text().encode()))
    cfg = DataConfig(dataset=str(src), tokenizer="char", root=str(tmp_path / "prepared"))
    msg = an_error_line(lambda: prepare_data(cfg, progress=False), str(src), "gzip-compressed", ".gz")
    assert "UTF-8" not in msg


def test_shakespeare_env_pointing_at_a_directory_says_it_is_a_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("SMALLGPT_SHAKESPEARE", str(tmp_path))
    msg = an_error_line(lambda: prepare_data(DataConfig(tokenizer="char", root=str(tmp_path / "p")), progress=False),
                   "SMALLGPT_SHAKESPEARE", "is a directory", "input.txt")
    assert "does not exist" not in msg


@given(kind=st.sampled_from(["long name", "long path", "loop", "under a file", "nul"]),
       source=st.sampled_from(["data.local_path", "SMALLGPT_SHAKESPEARE"]), n=st.integers(256, 2000))
def test_class_a_tiny_shakespeare_path_that_cannot_be_read_is_one_line(tmp_path_factory, monkeypatch, kind, source, n):
    # SMALLGPT_SHAKESPEARE with a name over 255 bytes was OSError: [Errno 36] File name too long, a traceback
    tmp = tmp_path_factory.mktemp("shakespeare")
    (tmp / "a").symlink_to(tmp / "b")
    (tmp / "b").symlink_to(tmp / "a")
    (tmp / "file").write_text("x")
    value = {"long name": str(tmp / ("x" * n)), "long path": str(tmp) + "/d" * (n * 2),
             "loop": str(tmp / "a" / "input.txt"), "under a file": str(tmp / "file" / "input.txt"),
             "nul": str(tmp / "in\0put.txt")}[kind]
    if kind == "nul" and source != "data.local_path":
        return  # an environment variable cannot hold a NUL byte
    monkeypatch.setenv("SMALLGPT_SHAKESPEARE", value if source != "data.local_path" else "")
    cfg = DataConfig(tokenizer="char", root=str(tmp / "p"), local_path=value if source == "data.local_path" else "")
    # data.local_path is a config path, checked with the others first (a name over 255 bytes, ...)
    msg = an_error_line(lambda: prepare_data(cfg, progress=False), source)
    assert len(msg) < 600, msg


# --- prepared-data paths of the wrong kind --------------------------------------------------------------


@pytest.fixture
def good(tmp_path):
    """A small source prepared once, its config and its prepared dir."""
    src = tmp_path / "src.txt"
    src.write_text("To be, or not to be, that is the question. " * 40, encoding="utf-8")
    cfg = DataConfig(dataset=str(src), tokenizer="char", root=str(tmp_path / "prepared"))
    return cfg, prepare_data(cfg, progress=False)


def test_a_file_where_the_prepared_dir_goes_is_one_line_and_kept(good, tmp_path):
    """Before: FileExistsError from mkdir, a traceback."""
    cfg, out = good
    cfg.root = str(tmp_path / "other")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / out.name).write_text("someone's notes")
    an_error_line(lambda: prepare_data(cfg, progress=False), str(tmp_path / "other" / out.name), "is a file",
             "move it away", "data.root")
    assert (tmp_path / "other" / out.name).read_text() == "someone's notes"


def test_a_shard_turned_into_a_directory_is_one_line_and_the_directory_kept(good):
    """Before: IsADirectoryError from the build's clean-up (os.replace, then unlink), a traceback."""
    cfg, out = good
    shard = first_file(out, "train")
    shard.unlink()
    shard.mkdir()
    (shard / "keep.txt").write_text("mine")
    an_error_line(lambda: prepare_data(cfg, progress=False), str(shard), "directory", "move it away", "data.root")
    assert (shard / "keep.txt").read_text() == "mine"
    assert first_file(out, "val").is_file()  # the rest of the data is still there


def test_a_readers_entry_that_is_a_file_is_one_line(good):
    cfg, out = good
    (out / ".readers").write_text("x")
    an_error_line(lambda: hold_data(out, "a test"), ".readers", "is a file", "move it away")


# --- the launch environment (torchrun's variables) -------------------------------------------------------


@pytest.fixture
def launch_env(monkeypatch):
    """Set launch variables for one test, with none of the process's own left over."""
    for k in LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    return lambda **env: [monkeypatch.setenv(k, str(v)) for k, v in env.items()]


@pytest.mark.parametrize("env,words", [
    (dict(WORLD_SIZE="abc", RANK=0), ["WORLD_SIZE='abc' is not an integer"]),
    (dict(WORLD_SIZE=2, RANK="x"), ["RANK='x' is not an integer"]),
    (dict(WORLD_SIZE=2, RANK=0, LOCAL_RANK=""), ["LOCAL_RANK='' is not an integer"]),
    (dict(RANK=1, WORLD_SIZE=1, LOCAL_RANK=0), ["RANK=1 is outside 0..0"]),  # a TypeError in on_rank0 before
    (dict(RANK=-1, WORLD_SIZE=2), ["RANK=-1 is outside 0..1"]),
    (dict(RANK=0, WORLD_SIZE=0), ["WORLD_SIZE=0 must be at least 1"]),
    (dict(RANK=0, WORLD_SIZE=10**30), [f"WORLD_SIZE={10**30} is more ranks than any launch starts"]),  # waited for ever
    (dict(RANK=0, WORLD_SIZE=2**20 + 1), ["is more ranks than any launch starts (at most 1,048,576)"]),
    (dict(RANK=0, WORLD_SIZE=2, LOCAL_RANK=-1), ["LOCAL_RANK=-1 is outside"]),
    (dict(WORLD_SIZE=2), ["WORLD_SIZE is set but RANK is not"]),
    (dict(RANK=0), ["RANK is set but WORLD_SIZE is not"]),
])
def test_bad_launch_variables_are_one_line_saying_to_use_torchrun(launch_env, env, words):
    launch_env(**env)
    an_error_line(dist_from_env, *words, "torchrun", "unset")


def test_good_launch_variables_still_give_the_ranks(launch_env):
    assert dist_from_env() == Parallel()
    launch_env(RANK=1, WORLD_SIZE=4, LOCAL_RANK=1)
    assert dist_from_env() == Parallel(rank=1, local_rank=1, world_size=4)


@pytest.mark.parametrize("env,words", [
    (dict(), ["WORLD_SIZE=2 but MASTER_ADDR is not set"]),  # a ValueError from init_process_group before
    (dict(MASTER_ADDR="127.0.0.1"), ["WORLD_SIZE=2 but MASTER_PORT is not set"]),
    (dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="http"), ["MASTER_PORT='http' is not a port number"]),
])
def test_a_missing_rendezvous_is_one_line_before_any_process_group(launch_env, monkeypatch, env, words):
    launch_env(RANK=0, WORLD_SIZE=2, **env)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **k: pytest.fail("tried to join a group"))
    an_error_line(lambda: dist_from_env().join(torch.device("cpu")), *words, "torchrun")


def test_train_refuses_bad_launch_variables_before_anything_is_written(launch_env, tmp_path):
    from training import loop
    from training.config.sections import load_config

    launch_env(WORLD_SIZE="abc", RANK=0)
    cfg = load_config([f"--train.out_dir={tmp_path / 'out'}", f"--data.root={tmp_path / 'data'}", "--wandb.mode=disabled"])
    an_error_line(lambda: loop.train(cfg), "WORLD_SIZE='abc'", "torchrun")
    assert not (tmp_path / "out").exists() and not (tmp_path / "data").exists()


def test_a_streamed_hf_dataset_that_fails_midway_blames_the_network_not_data_root(tmp_path, monkeypatch):
    import datasets

    def rows():
        yield {"text": "streamed text " * 50}
        raise ConnectionError("Connection reset by peer")

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.IterableDataset.from_generator(rows))
    cfg = DataConfig(dataset="hf:x/y", root=str(tmp_path / "prepared"), tokenizer="char", streaming=True)
    msg = an_error_line(lambda: prepare_data(cfg, progress=False), "could not read HF dataset 'x/y'", "Connection reset",
                   "check your network")
    assert "data.root" not in msg


# --- every number or path the product reads from the environment: garbage is one line or measured around --

GARBAGE = st.one_of(
    st.sampled_from(["", " ", "abc", "1.5", "1e3", "nan", "-0", "٢", "²", "２", " 2", "2_0", "0x10", "~"]),
    st.integers(-10**30, 10**30).map(str),
    st.floats(allow_nan=True).map(str),
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=20),
)
NUMBER_VARS = ("LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
PATH_VARS = ("SMALLGPT_CACHE_DIR", "XDG_CACHE_HOME") + WANDB_DIR_VARIABLES


def _read_all_env(device=torch.device("cpu")):
    """What train.py (dist_from_env, its rendezvous, the memory check), sample.py (the memory check), the
    choices cache and the wandb folder check read from the environment, in the order a run reads them."""
    par = dist_from_env()
    distributed.check_rendezvous(par)
    check_fits({"nothing": 0}, device, "this", "nothing")
    choices.cpu_peak(torch.float32, lambda: 1.0)
    return unusable_dir_variable()


@given(name=st.sampled_from(NUMBER_VARS + PATH_VARS), value=GARBAGE)
def test_any_value_of_an_environment_variable_is_one_line_or_taken(tmp_path, name, value):
    """Before: LOCAL_WORLD_SIZE='abc' (or '') stopped train.py and sample.py with int()'s ValueError and a
    traceback, MASTER_PORT='²' passed isdigit() into the same ValueError, and a WANDB_DIR thousands of
    folders deep a RecursionError. A launch variable is set the way torchrun sets it (a world of 2) apart
    from the one under test; a path may be anything (a cache that can't be used is measured around)."""
    with pytest.MonkeyPatch.context() as mp:  # per example: a function's fixtures would carry one example's over
        mp.chdir(tmp_path)  # relative garbage paths are made here, not in the checkout
        for k in LAUNCH_VARS:
            mp.delenv(k, raising=False)
        if name in NUMBER_VARS:
            for k, v in dict(RANK=0, WORLD_SIZE=2, LOCAL_RANK=0, LOCAL_WORLD_SIZE=2, MASTER_ADDR="127.0.0.1",
                             MASTER_PORT=29500).items():
                mp.setenv(k, str(v))
        mp.setenv(name, value)
        try:
            why = _read_all_env()
        except UserError as e:
            why = e
    if isinstance(why, UserError):
        e = why
        msg = str(e)
        assert "\n" not in msg and f"{name}=" in msg and ("torchrun" in msg or "unset" in msg), msg
        return
    assert name not in PATH_VARS[2:] or why == "" or why.startswith(f"{name}="), why
    if name in NUMBER_VARS:  # taken: only what torchrun itself could have written
        assert value.isascii() and value.isdigit(), value


@pytest.mark.parametrize("value", ["abc", "", "a/" * 3000])
def test_an_unusable_wandb_folder_variable_is_named(monkeypatch, tmp_path, value):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", value or "/dev/null/x")
    assert unusable_dir_variable() == "" if value == "abc" else unusable_dir_variable().startswith("WANDB_DIR=")


def test_train_py_names_a_bad_local_world_size_in_one_line(tmp_path):
    """The subprocess check of the class: the line run_cli prints, and no traceback."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS} | {"LOCAL_WORLD_SIZE": "abc"}
    out = subprocess.run([sys.executable, "train.py", "--config", "small.yaml", f"--train.out_dir={tmp_path / 'o'}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: LOCAL_WORLD_SIZE='abc'"), out.stderr
    assert not (tmp_path / "o").exists()
