"""One folder, one owner (ownership.py): no command writes into a folder of another kind, inside one, or
around one; a refusal is one line, before anything is written, and every file already there keeps its bytes.
A rebuild of prepared data removes only what its previous manifest names."""
from __future__ import annotations

import os
import shutil
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ownership
from checkpoint.__main__ import consolidate
from checkpoint.export import export_hf
from checkpoint import claim_out_dir
from data import DataConfig, load_meta, prepare_data
from errors import UserError
from model.gpt import GPT, GPTConfig

DEV = os.environ.get("HYPOTHESIS_PROFILE") == "dev"  # by hand: many random examples; in CI few, fixed
PROPERTY = settings(max_examples=400 if DEV else 40, derandomize=not DEV, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` (the listing) with its bytes (None for a folder)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def refused(fn, *names) -> str:
    """fn raises one UserError line naming each of `names`."""
    with pytest.raises(UserError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg, msg
    for name in names:
        assert str(name) in msg, (name, msg)
    return msg


def data_cfg(src: Path, root: Path) -> DataConfig:
    return DataConfig(dataset=str(src), tokenizer="char", root=str(root))


def claim(out_dir: Path) -> None:
    claim_out_dir(out_dir, say=lambda line: None).release()


def fake_out_dir(path: Path) -> Path:
    """An out_dir written by today's train.py before markers existed: its checkpoint and log."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "ckpt.pt").write_bytes(b"weights of a run")
    (path / "metrics.jsonl").write_text('{"iter": 0}\n')
    return path


def fake_export(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"tensors")
    return path


def fake_dcp(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / ".metadata").write_bytes(b"index")
    (path / "__0_0.distcp").write_bytes(b"shards")
    return path


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("source") / "corpus.txt"
    p.write_text(TEXT)
    return p


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, src) -> Path:
    """A real prepared folder (copied wherever a test needs one: a copy is as up to date as the original)."""
    return prepare_data(data_cfg(src, tmp_path_factory.mktemp("scratch")), progress=False)


@pytest.fixture(scope="module")
def model() -> GPT:
    return GPT(GPTConfig(block_size=8, vocab_size=50257, n_layer=1, n_head=1, n_embd=8))


GPT2 = {"tokenizer": "gpt2", "chars": None}


# ------------------------------------------------------------------------------------------ kinds


def test_each_kind_is_recognised_by_its_marker_or_by_what_todays_code_leaves(tmp_path, prepared):
    assert ownership.kind_of(fake_out_dir(tmp_path / "old-run")) == ownership.OUT_DIR
    assert ownership.kind_of(prepared) == ownership.DATA
    assert ownership.kind_of(fake_export(tmp_path / "hf")) == ownership.EXPORT
    assert ownership.kind_of(fake_dcp(tmp_path / "x.dcp")) == ownership.CHECKPOINT
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "config.json").write_text("{}")  # half an export is not one
    assert ownership.kind_of(tmp_path / "notes") is None
    assert ownership.kind_of(tmp_path / "missing") is None
    claim(tmp_path / "new-run")
    assert ownership.kind_of(tmp_path / "new-run") == ownership.OUT_DIR
    assert sorted(p.name for p in (tmp_path / "new-run").iterdir()) == [ownership.MARKER]  # the lock is gone


def test_a_manifest_is_recognised_around_an_output_by_its_first_keys_in_bounded_memory(tmp_path, prepared):
    """A prepared folder near an output is known by its meta.json's first keys, read from its first bytes: a
    manifest of hundreds of MiB (a corpus of many files; here sparse past its first keys) is recognised without
    being read whole, and a JSON that is no manifest (other keys first, small or large) is not."""
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "meta.json", "wb") as f:
        f.write(b'{\n "tokens_sha256": "ab", "format_version": 2, "source": "corpus/", "val_dataset": null,\n'
                b' "tokenizer": "char", "vocab_size": 66,\n "shards": [')
        f.truncate(300 << 20)
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir(), large.mkdir()
    (small / "meta.json").write_text('{"name": "not ours", "tokenizer": "char"}')
    with open(large / "meta.json", "wb") as f:
        f.write(b'{"rows": [')
        f.truncate(300 << 20)
    tracemalloc.start()
    try:
        kinds = [ownership.kind_of(p, around=True) for p in (prepared, big, small, large)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert kinds == [ownership.DATA, ownership.DATA, None, None] and peak < 4 << 20


def test_an_out_dir_of_todays_code_without_a_marker_is_claimed_again_and_keeps_its_files(tmp_path):
    run = fake_out_dir(tmp_path / "run")
    before = snapshot(run)
    claim(run)
    after = snapshot(run)
    assert set(after) - set(before) == {ownership.MARKER}
    assert {k: v for k, v in after.items() if k != ownership.MARKER} == before


# ------------------------------------------------------------------------------------------ the out_dir


def test_an_out_dir_equal_to_a_prepared_data_folder_is_refused_and_nothing_there_changes(tmp_path, prepared):
    folder = Path(shutil.copytree(prepared, tmp_path / prepared.name))
    before = snapshot(tmp_path)
    msg = refused(lambda: claim(folder), folder, "train.out_dir", "prepared data folder")
    assert "choose another train.out_dir" in msg
    assert snapshot(tmp_path) == before


def test_an_out_dir_inside_a_prepared_data_folder_is_refused_and_nothing_there_changes(tmp_path, prepared):
    folder = Path(shutil.copytree(prepared, tmp_path / prepared.name))
    before = snapshot(tmp_path)
    msg = refused(lambda: claim(folder / "run"), folder / "run", folder, "outside it")
    assert "prepared data folder" in msg
    assert snapshot(tmp_path) == before  # not even the run's folder was made


def test_nested_out_dirs_are_refused_whichever_comes_first(tmp_path):
    claim(tmp_path / "a")
    before = snapshot(tmp_path)
    refused(lambda: claim(tmp_path / "a" / "b"), tmp_path / "a" / "b", tmp_path / "a", "training out_dir")
    assert snapshot(tmp_path) == before
    claim(tmp_path / "c" / "d")
    before = snapshot(tmp_path)
    refused(lambda: claim(tmp_path / "c"), tmp_path / "c", tmp_path / "c" / "d", "move")
    assert snapshot(tmp_path) == before


def test_an_out_dir_holds_its_own_sharded_checkpoints(tmp_path):
    run = fake_out_dir(tmp_path / "run")
    fake_dcp(run / "ckpt.dcp")
    claim(run)  # no refusal: ckpt.dcp/ is the run's own
    fake_dcp(run / "old" / "x.dcp")  # one level down it is not
    refused(lambda: claim(run), run / "old" / "x.dcp", "sharded checkpoint")


# ------------------------------------------------------------------------------------------ prepared data


def test_a_data_root_inside_an_out_dir_is_refused_before_anything_is_written(tmp_path, src):
    claim(tmp_path / "run")
    fake_out_dir(tmp_path / "old-run")  # and one of today's, without a marker
    for run in (tmp_path / "run", tmp_path / "old-run"):
        before = snapshot(tmp_path)
        msg = refused(lambda: prepare_data(data_cfg(src, run / "data"), progress=False), run / "data", run)
        assert "set data.root to a directory outside it" in msg
        assert snapshot(tmp_path) == before
        refused(lambda: prepare_data(data_cfg(src, run), progress=False), run)  # data.root = the out_dir itself
        assert snapshot(tmp_path) == before


def test_a_prepared_folder_that_is_an_out_dir_is_refused(tmp_path, src, prepared):
    """out_dir set to the folder prepare prints before it was ever prepared: the run claims it first, and
    the prepare then refuses to put its data there."""
    run = tmp_path / prepared.name
    claim(run)
    before = snapshot(tmp_path)
    refused(lambda: prepare_data(data_cfg(src, tmp_path), progress=False), run, "training out_dir", "data.root")
    assert snapshot(tmp_path) == before


def test_a_rebuild_removes_what_its_manifest_named_and_leaves_a_strangers_files_untouched(tmp_path, capsys):
    src = tmp_path / "corpus.txt"
    src.write_text(TEXT)
    folder = prepare_data(data_cfg(src, tmp_path / "root"), progress=False)
    meta = load_meta(folder)
    old = {sh["name"] for s in ("train", "val") for sh in meta["shards"][s]}
    # the story: a run's files beside the shards (written before markers existed), and a note
    strangers = {"ckpt.pt": b"\x00weights", "best.pt": b"\x01best", "metrics.jsonl": b'{"iter": 1}\n',
                 "notes.txt": b"mine"}
    for name, data in strangers.items():
        (folder / name).write_bytes(data)
    capsys.readouterr()
    src.write_text(TEXT + "one more line changes the corpus\n")
    assert prepare_data(data_cfg(src, tmp_path / "root"), progress=False) == folder
    err = capsys.readouterr().err
    new = load_meta(folder)
    assert new["fingerprint"] != meta["fingerprint"]  # it was rebuilt
    names = {p.name for p in folder.iterdir()}
    assert not old & names  # the replaced shards are gone
    for name, data in strangers.items():
        assert (folder / name).read_bytes() == data
    left = [line for line in err.splitlines() if line.startswith("left ")]
    assert len(left) == 1 and all(name in left[0] for name in strangers) and str(folder) in left[0], err


def test_a_rebuild_removes_a_killed_builds_files_but_not_a_look_alike(tmp_path, capsys):
    src = tmp_path / "corpus.txt"
    src.write_text(TEXT)
    folder = prepare_data(data_cfg(src, tmp_path / "root"), progress=False)
    (folder / "train-0123456789ab-00000.bin").write_bytes(b"\x00\x01")  # a killed build's shard
    (folder / ".prepare-0123456789ab.json").write_text("{}")  # and its record
    (folder / "train-final.bin").write_bytes(b"kept")  # a name the prepare never writes
    src.write_text(TEXT + "changed\n")
    prepare_data(data_cfg(src, tmp_path / "root"), progress=False)
    names = {p.name for p in folder.iterdir()}
    assert "train-0123456789ab-00000.bin" not in names and ".prepare-0123456789ab.json" not in names
    assert (folder / "train-final.bin").read_bytes() == b"kept"
    assert "train-final.bin" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ export, consolidate


def test_an_export_into_an_out_dir_or_a_data_folder_is_refused_and_nothing_there_changes(tmp_path, prepared, model):
    run = fake_out_dir(tmp_path / "run")
    claim(tmp_path / "new-run")
    folder = Path(shutil.copytree(prepared, tmp_path / "data"))
    for out in (run, tmp_path / "new-run", folder, run / "hf", folder / "hf", tmp_path / "new-run" / "x" / "hf"):
        before = snapshot(tmp_path)
        refused(lambda: export_hf(model, GPT2, out), out, "--out")
        assert snapshot(tmp_path) == before


def test_an_export_around_a_managed_folder_is_refused(tmp_path, model):
    fake_dcp(tmp_path / "hf" / "x.dcp")
    before = snapshot(tmp_path)
    refused(lambda: export_hf(model, GPT2, tmp_path / "hf"), tmp_path / "hf" / "x.dcp", "sharded checkpoint")
    assert snapshot(tmp_path) == before


def test_consolidate_into_the_checkpoint_it_reads_or_another_managed_folder_is_refused(tmp_path, prepared):
    run = fake_out_dir(tmp_path / "run")
    dcp = fake_dcp(run / "ckpt.dcp")
    folder = Path(shutil.copytree(prepared, tmp_path / "data"))
    other = fake_out_dir(tmp_path / "other-run")
    export = fake_export(tmp_path / "hf")
    for out in (dcp / "one.pt", dcp, folder / "one.pt", other / "one.pt", export / "one.pt", run / "metrics.jsonl",
                run / "best.pt", folder):
        before = snapshot(tmp_path)
        refused(lambda: consolidate(dcp, out), out, "--out")
        assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------------------------ the whole class

WRITERS = ("out_dir", "data", "export", "consolidate")
KINDS = (ownership.OUT_DIR, ownership.DATA, ownership.EXPORT, ownership.CHECKPOINT)


@PROPERTY
@given(writer=st.sampled_from(WRITERS), other=st.sampled_from(KINDS),
       relation=st.sampled_from(("equal", "inside", "around")), depth=st.integers(1, 2), marked=st.booleans())
def test_no_writer_mixes_its_folder_with_a_managed_folder_of_another_kind(prepared, src, model, writer, other,
                                                                          relation, depth, marked):
    """Writer A (train.py's out_dir claim, a prepare, an export, a consolidate) and a managed folder B that
    is A's target, holds it, or lies inside it: A refuses in one line naming B, and nothing changes; the
    only exceptions are A's own folder (same kind, same place) and an out_dir's own sharded checkpoint."""
    if writer == "consolidate" and relation == "around":
        return  # a file holds no folder
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(os.path.realpath(tmp)) / "base"
        base.mkdir()
        leaf = {"data": prepared.name, "consolidate": "one.pt"}.get(writer, "target")
        between = Path(*["x"] * (depth - 1)) if depth > 1 else Path()
        if relation == "equal":
            b, target = base / leaf, base / leaf
        elif relation == "inside":
            b = base / "b"
            target = b / between / leaf
        else:
            target = base / leaf
            b = target / between / "b"
        if other == ownership.OUT_DIR:
            claim(b) if marked else fake_out_dir(b)
            (b / "metrics.jsonl").write_text("{}\n")
        elif other == ownership.DATA:
            shutil.copytree(prepared, b)
        elif other == ownership.EXPORT:
            fake_export(b)
        else:
            fake_dcp(b)
        source = fake_dcp(Path(tmp) / "run" / "ckpt.dcp")
        write = {
            "out_dir": lambda: claim(target),
            "data": lambda: prepare_data(data_cfg(src, target.parent), progress=False),
            "export": lambda: export_hf(model, GPT2, target),
            "consolidate": lambda: consolidate(source, target),
        }[writer]
        allowed = (relation == "equal" and writer == other and writer != "export") or \
            (writer == "out_dir" and other == ownership.CHECKPOINT and relation == "around" and depth == 1)
        before, before_b = snapshot(base), snapshot(b)
        if allowed:
            write()
            after = snapshot(b)
            if b == target:  # the claim marks its own out_dir (again)
                after.pop(ownership.MARKER, None), before_b.pop(ownership.MARKER, None)
            assert after == before_b
        else:
            refused(write, b)
            assert snapshot(base) == before


# ------------------------------------------------------------------------------- everyday use stays allowed

def test_a_stray_checkpoint_or_meta_json_above_or_below_does_not_make_a_folder_managed(tmp_path):
    """Around the folder a command writes, a folder is managed only by its marker or a run's own signature
    (its log beside its checkpoints, a manifest that prepare wrote): a downloaded ckpt.pt in a home directory,
    or any meta.json, must not block every run beneath it."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "ckpt.pt").write_bytes(b"a downloaded checkpoint")
    (home / "meta.json").write_text('{"name": "not ours"}')
    claim(home / "out")  # not "inside a training out_dir"
    backup = home / "out" / "old"  # a copy kept inside the run's own out_dir
    backup.mkdir()
    (backup / "ckpt.pt").write_bytes(b"a copy")
    claim(home / "out")  # the run resumes: its backup folder is no out_dir of its own
    assert ownership.kind_of(home, around=True) is None
    fake_out_dir(tmp_path / "run")  # a real run's log and checkpoint: still recognised around a target
    refused(lambda: claim(tmp_path / "run" / "inner"), "run")


def test_a_start_refused_after_the_claim_leaves_no_marker_behind(tmp_path, data_root):
    """train.py claims (and marks) its out_dir before the data: a refusal then (here data.root inside the
    out_dir) removes the marker again, so the folder is not a hidden obstacle for the next run."""
    from training import loop
    from training.config.sections import load_config

    out = tmp_path / "work"
    argv = ["--data.tokenizer=char", f"--data.root={out / 'prepared'}", f"--train.out_dir={out}", "--train.device=cpu",
            "--model.n_layer=1", "--model.n_head=2", "--model.n_embd=16", "--model.block_size=16",
            "--train.max_iters=1", "--wandb.mode=disabled"]
    with pytest.raises(UserError, match="lies inside"):
        loop.train(load_config(argv))
    assert not (out / ownership.MARKER).exists()
    claim(out / "run")  # nothing marks `work` now: an out_dir below it is fine


def test_a_glob_source_lets_data_root_sit_in_its_folder_unless_it_matches_the_prepared_files(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("To be, or not to be, that is the question. " * 40)
    (corpus / "val.txt").write_text("Whether 'tis nobler in the mind to suffer. " * 40)
    out = prepare_data(DataConfig(dataset=str(corpus / "a*.txt"), val_dataset=str(corpus / "val*.txt"),
                                  tokenizer="char", root=str(corpus / "prepared")), progress=False)
    assert load_meta(out)["vocab_size"] > 10  # *.txt never matches what prepare writes: allowed
    before = snapshot(tmp_path)
    refused(lambda: prepare_data(DataConfig(dataset=str(corpus / "**" / "*.json"), tokenizer="char",
                                            root=str(corpus / "prepared")), progress=False), "data.root", "meta.json")
    assert snapshot(tmp_path) == before
