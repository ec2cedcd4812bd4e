"""A damaged sharded checkpoint (ckpt.dcp/ of a 1-rank train.parallel=fsdp run), every kind of damage x
every reader: one line naming the checkpoint, never a traceback (DCP's CheckpointException is a
BaseException, which `except Exception` let through), and the checkpoint left as it was.

The damage: a shard (.distcp) missing, truncated, emptied or replaced by a folder; the .metadata
truncated, emptied, missing, or holding a pickle the safe reader refuses; state.pt truncated or missing.
The readers: sample.py, consolidate, a resume (train.py on the same out_dir), model.init_from, HellaSwag
and the HF export (both load the model before anything of their own).
"""
from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

import eval.hellaswag as hellaswag
from inference import sample_cli
from training import cli as train_cli
from checkpoint.__main__ import main as checkpoint_main
from checkpoint.export import main as export_main

from hostile_world import SAMPLE_FAST, run_entry, snapshot, train_argv
from cli_lines import an_error_line


def _cut(path: Path, keep: float) -> None:
    path.write_bytes(path.read_bytes()[:int(path.stat().st_size * keep)])


def _shard(ckpt: Path) -> Path:
    return next(ckpt.glob("*.distcp"))


def _claim(ckpt: Path, key: str, size) -> None:
    """Rewrite the .metadata so that it claims `size` for tensor `key` (the shards are left as written)."""
    import torch

    from checkpoint.sharded import _MetadataUnpickler

    md = _MetadataUnpickler(open(ckpt / ".metadata", "rb")).load()
    md.state_dict_metadata[key].size = torch.Size(size)
    (ckpt / ".metadata").write_bytes(pickle.dumps(md))


WTE = "model.transformer.wte.weight"

DAMAGE = {
    "shard missing": lambda c: _shard(c).unlink(),
    "shard truncated": lambda c: _cut(_shard(c), 0.5),
    "shard truncated by a byte": lambda c: _cut(_shard(c), 1 - 1 / _shard(c).stat().st_size),
    "shard empty": lambda c: _cut(_shard(c), 0),
    "shard a folder": lambda c: (_shard(c).unlink(), _shard_dir(c)),
    "metadata truncated": lambda c: _cut(c / ".metadata", 0.5),
    "metadata empty": lambda c: _cut(c / ".metadata", 0),
    "metadata refused": lambda c: (c / ".metadata").write_bytes(pickle.dumps(os.getcwd)),  # a function: no
    "metadata missing": lambda c: (c / ".metadata").unlink(),
    "metadata huge (sparse)": lambda c: os.truncate(c / ".metadata", 20 * 2**30),
    "metadata claims a 4 TiB tensor": lambda c: _claim(c, WTE, (2**20, 2**20)),
    "metadata claims a tensor of another shape": lambda c: _claim(c, WTE, (7, 8)),
    "state.pt truncated": lambda c: _cut(c / "state.pt", 0.5),
    "state.pt missing": lambda c: (c / "state.pt").unlink(),
}


def _shard_dir(ckpt: Path) -> None:
    (ckpt / "__0_0.distcp").mkdir()


READERS = {
    "sample.py": lambda run, w, t: (sample_cli.main, ["--checkpoint", run, *SAMPLE_FAST]),
    "consolidate": lambda run, w, t: (checkpoint_main, ["consolidate", run, "--out", t / "one.pt"]),
    "resume": lambda run, w, t: (train_cli.main, train_argv(run, w.data_root, "--train.parallel=fsdp",
                                                        "--train.max_iters=4")),
    "model.init_from": lambda run, w, t: (train_cli.main, [*train_argv(t / "new", w.data_root),
                                                       f"--model.init_from={run / 'ckpt.dcp'}"]),
    "eval.hellaswag": lambda run, w, t: (hellaswag.main, ["--checkpoint", run, "--data", w.hellaswag, "--device", "cpu"]),
    "checkpoint.export": lambda run, w, t: (export_main, ["--checkpoint", run, "--out", t / "hf"]),
}


def tree(path: Path) -> dict:
    # a huge (sparse) file by its size and time, not its 20 GB of bytes
    return {str(p.relative_to(path)): ("huge", p.stat().st_size, p.stat().st_mtime_ns) if p.is_file()
            and p.stat().st_size > 2**26 else snapshot(p) for p in sorted(path.rglob("*"))}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_sharded_checkpoint_is_one_line_for_every_reader(world, tmp_path, capsys, damage, reader):
    run = tmp_path / "run"
    shutil.copytree(world.run, run)
    for aside in run.glob("best.dcp"):  # no second checkpoint to fall back on: the damaged one is read
        shutil.rmtree(aside)
    DAMAGE[damage](run / "ckpt.dcp")
    before = tree(run / "ckpt.dcp")
    main, argv = READERS[reader](run, world, tmp_path)
    code, _, err = run_entry(main, argv, capsys)
    line = an_error_line(code, err)
    assert "ckpt.dcp" in line or str(run) in line, line
    assert tree(run / "ckpt.dcp") == before  # read, never repaired or replaced


# ------------------------------------------------------------------- a ckpt.dcp/ that is no whole checkpoint

# What a sharded save killed mid-write (or a hand) leaves in ckpt.dcp/: any mix of these. Each reader must
# name it as an incomplete sharded checkpoint, never "a single-file checkpoint" nor "no ckpt.dcp in ckpt.dcp".
DCP_ENTRIES = {
    ".metadata": lambda d: (d / ".metadata").write_bytes(b"junk"),
    "state.pt": lambda d: (d / "state.pt").write_bytes(b"junk"),
    "a junk shard": lambda d: (d / "__0_0.distcp").write_bytes(b"\0" * 10),
    "a junk file": lambda d: (d / "notes.txt").write_text("x"),
    "a nested folder": lambda d: (d / "ckpt.dcp").mkdir(),
    ".metadata a folder": lambda d: (d / ".metadata").mkdir(),
}
WRONG = ("single-file", "no ckpt.pt or ckpt.dcp in directory", "Traceback")


def _in_process_readers(run: Path) -> dict:
    from checkpoint import load_for_inference
    from checkpoint.__main__ import consolidate
    from checkpoint.resume import decide_resume

    resume = lambda: decide_resume(run, mode="auto", config_conflicts=lambda c: [], gather=lambda o: [o])  # noqa: E731
    return {"load_for_inference(out_dir)": lambda: load_for_inference(str(run)),
            "load_for_inference(ckpt.dcp)": lambda: load_for_inference(str(run / "ckpt.dcp")),
            "consolidate(out_dir)": lambda: consolidate(run), "consolidate(ckpt.dcp)": lambda: consolidate(run / "ckpt.dcp"),
            "resume": resume}


def _refused(read) -> str:
    from errors import UserError

    with pytest.raises(UserError) as e:
        read()
    line = str(e.value)
    assert "\n" not in line and not any(w in line for w in WRONG), line
    return line


@given(entries=st.lists(st.sampled_from(sorted(DCP_ENTRIES)), unique=True)
       .filter(lambda e: not {".metadata", ".metadata a folder"} <= set(e)))
def test_an_incomplete_ckpt_dcp_is_named_so_by_every_reader(entries):
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        (run / "ckpt.dcp").mkdir(parents=True)
        for entry in entries:
            DCP_ENTRIES[entry](run / "ckpt.dcp")
        before = tree(run)
        whole = {"state.pt", ".metadata"} <= set(entries)  # both there (junk): read, and refused as damaged
        for name, read in _in_process_readers(run).items():
            line = _refused(read)
            assert str(run / "ckpt.dcp") in line, (name, line)
            assert whole or "it is incomplete" in line, (name, entries, line)
        assert tree(run) == before  # read, never repaired, and no consolidated.pt beside it


@given(missing=st.sampled_from(["run", "run/ckpt.dcp", "run/best.dcp", "nowhere/ckpt.pt"]))
def test_a_missing_checkpoint_path_is_named_missing(missing):
    from checkpoint import load_for_inference
    from checkpoint.__main__ import consolidate

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "run").mkdir()
        path = Path(tmp) / missing
        if missing == "run":
            path = Path(tmp) / "gone"
        for read in (lambda: load_for_inference(str(path)), lambda: consolidate(path)):
            assert "does not exist" in _refused(read)


@pytest.mark.parametrize("entry", ["empty", "state.pt"])
def test_sample_py_names_an_incomplete_ckpt_dcp(tmp_path, capsys, entry):
    (tmp_path / "ckpt.dcp").mkdir()
    if entry != "empty":
        DCP_ENTRIES[entry](tmp_path / "ckpt.dcp")
    code, _, err = run_entry(sample_cli.main, ["--checkpoint", tmp_path, *SAMPLE_FAST], capsys)
    assert "it is incomplete" in an_error_line(code, err, str(tmp_path / "ckpt.dcp"))


# ------------------------------------------------------------------- sizes claimed by the .metadata

def _shapes_of(ckpt: Path) -> dict:
    from checkpoint.sharded import _MetadataUnpickler

    md = _MetadataUnpickler(open(ckpt / ".metadata", "rb")).load()
    return {k: tuple(v.size) for k, v in md.state_dict_metadata.items() if k.startswith("model.") and hasattr(v, "size")}


_CLAIMS = st.lists(st.integers(0, 2**40), max_size=4) | st.lists(st.integers(0, 70), min_size=1, max_size=3)


@given(data=st.data(), claim=_CLAIMS)
def test_a_claimed_size_is_refused_by_arithmetic_before_anything_is_allocated(world, data, claim):
    """Any size the .metadata claims for a model tensor: loaded when it is the tensor's true shape (the shape
    written, read from the untouched checkpoint: the reference), else one line naming the tensor, and never an
    allocation of more bytes than the shard files hold (a spy on torch.empty)."""
    import torch

    from checkpoint import load_checkpoint
    from errors import UserError

    shapes = _shapes_of(world.run / "ckpt.dcp")
    key = data.draw(st.sampled_from(sorted(shapes)))
    claim = data.draw(st.sampled_from([tuple(claim), shapes[key]]))
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt.dcp"
        shutil.copytree(world.run / "ckpt.dcp", ckpt)
        _claim(ckpt, key, claim)
        held = sum(f.stat().st_size for f in ckpt.glob("*.distcp"))
        empty = torch.empty

        def spy(*size, **kw):
            dims = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
            n = (kw.get("dtype") or torch.float32).itemsize
            for d in dims:
                n *= d
            if n > held:
                raise SystemExit(f"allocated {dims} before refusing it")  # caught by nothing on the way
            return empty(*size, **kw)

        with pytest.MonkeyPatch.context() as m:
            m.setattr(torch, "empty", spy)
            if claim == shapes[key]:
                assert tuple(load_checkpoint(ckpt, needed=("model",))["model"][key[len("model."):]].shape) == claim
            else:
                line = _refused(lambda: load_checkpoint(ckpt, needed=("model",)))
                assert str(ckpt) in line and key in line and len(line) < 400, line


# ------------------------------------------------------------------- one read of the .metadata a load

def test_a_sharded_load_reads_its_metadata_once_and_builds_one_meta_model(world, monkeypatch):
    """Each load of a ckpt.dcp (inference's load_model, consolidate's load_checkpoint, a resume's load_into)
    unpickles its .metadata once (handed to DCP's reader, not read again) and builds at most one meta model (its
    shapes checked against the one the weights then go into)."""
    import checkpoint.meta
    from checkpoint import load_checkpoint, load_model
    from checkpoint.load import checked_model_config
    from checkpoint.sharded import _MetadataUnpickler, load_into
    from model.gpt import GPT

    counts = {"unpickles": 0, "meta models": 0}
    unpickle = _MetadataUnpickler.load

    def counted_load(self):
        counts["unpickles"] += 1
        return unpickle(self)

    class Counted(checkpoint.meta.GPT):
        def __init__(self, *a, **k):
            counts["meta models"] += 1
            super().__init__(*a, **k)

    monkeypatch.setattr(_MetadataUnpickler, "load", counted_load)
    monkeypatch.setattr(checkpoint.meta, "GPT", Counted)
    ckpt = world.run / "ckpt.dcp"
    config = checked_model_config(load_checkpoint(ckpt)["model_config"], ckpt)
    counts.update({"unpickles": 0, "meta models": 0})
    reference = load_model(str(ckpt)).model.state_dict()
    assert counts == {"unpickles": 1, "meta models": 1}
    counts.update({"unpickles": 0, "meta models": 0})
    assert load_checkpoint(ckpt, needed=("model",))["model"].keys() == reference.keys()
    assert counts == {"unpickles": 1, "meta models": 1}
    counts.update({"unpickles": 0, "meta models": 0})
    state = {"model": GPT(config).state_dict()}
    load_into(ckpt, state)
    assert counts == {"unpickles": 1, "meta models": 0}
    assert all(state["model"][k].equal(v) for k, v in reference.items())
