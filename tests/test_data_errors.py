"""Bad input: a one-line UserError naming the problem and the fix, and good prepared data untouched."""
from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from pathlib import Path

import datasets
import pytest
from hypothesis import given
from hypothesis import strategies as st

import data.download
from data.prepare import main as prepare_main
from data import BatchLoader, DataConfig, load_meta, prepare_data
from errors import UserError, run_cli
from prepared_files import first_file
import warm_runs

ROOT = Path(__file__).resolve().parents[1]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def user_error(fn, *words: str) -> str:
    """Run fn, expect a UserError whose message is one line, has a fix after ';', and names `words`."""
    with pytest.raises(UserError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg, msg
    problem, _, fix = msg.partition(";")
    assert problem.strip() and fix.strip(), f"no fix in: {msg}"
    for w in words:
        assert w in msg, f"{w!r} not in: {msg}"
    return msg


@pytest.fixture
def good(tmp_path):
    """A source prepared once (good data) and its config; tests break something and re-run."""
    src = tmp_path / "src.txt"
    src.write_text("To be, or not to be, that is the question. " * 40, encoding="utf-8")
    cfg = DataConfig(dataset=str(src), tokenizer="char", root=str(tmp_path / "prepared"))
    out = prepare_data(cfg, progress=False)
    return cfg, out, snapshot(out)


def test_missing_local_path(good, tmp_path):
    cfg, out, before = good
    cfg.dataset = str(tmp_path / "no-such-file.txt")
    user_error(lambda: prepare_data(cfg, progress=False), "no-such-file.txt", "does not exist", "shakespeare")
    cfg.dataset = str(tmp_path / "nothing-*.txt")
    user_error(lambda: prepare_data(cfg, progress=False), "no files match")
    assert snapshot(out) == before


def test_missing_shakespeare_copy_named_by_env_or_config(tmp_path, monkeypatch):
    monkeypatch.setenv("SMALLGPT_SHAKESPEARE", str(tmp_path / "gone.txt"))
    user_error(lambda: prepare_data(DataConfig(root=str(tmp_path)), progress=False), "SMALLGPT_SHAKESPEARE", "gone.txt")
    cfg = DataConfig(root=str(tmp_path), local_path=str(tmp_path / "also-gone.txt"))
    user_error(lambda: prepare_data(cfg, progress=False), "data.local_path", "also-gone.txt")


def test_offline_without_shakespeare_says_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SMALLGPT_SHAKESPEARE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def offline(*a, **k):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    msg = user_error(lambda: prepare_data(DataConfig(root=str(tmp_path)), progress=False), "SMALLGPT_SHAKESPEARE", data.download.SHAKESPEARE_URL)
    assert str(tmp_path / "cache/smallgpt/tinyshakespeare/input.txt") in msg
    assert not (tmp_path / "cache/smallgpt/tinyshakespeare/input.txt").exists()


def test_download_with_wrong_checksum_is_refused_and_not_cached(tmp_path, monkeypatch):
    import io

    monkeypatch.delenv("SMALLGPT_SHAKESPEARE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: io.BytesIO(b"<html>captive portal</html>"))
    user_error(lambda: prepare_data(DataConfig(root=str(tmp_path)), progress=False), "sha256")
    assert not (tmp_path / "cache/smallgpt/tinyshakespeare/input.txt").exists()


def test_endless_download_is_read_bounded_and_refused(tmp_path, monkeypatch):
    class Endless:  # a server that never stops sending: read() without a bound would never return
        def read(self, n=-1):
            assert n > 0, "unbounded read"
            return b"x" * n

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.delenv("SMALLGPT_SHAKESPEARE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: Endless())
    user_error(lambda: prepare_data(DataConfig(root=str(tmp_path)), progress=False), "sha256")
    assert not (tmp_path / "cache/smallgpt/tinyshakespeare/input.txt").exists()


def test_shakespeare_copy_with_other_content_is_refused(tmp_path, monkeypatch):
    fake = tmp_path / "input.txt"
    fake.write_text("not shakespeare", encoding="utf-8")
    monkeypatch.setenv("SMALLGPT_SHAKESPEARE", str(fake))
    user_error(lambda: prepare_data(DataConfig(root=str(tmp_path)), progress=False), "sha256", f"data.dataset: {fake}")


def test_empty_source_leaves_the_good_data(good):
    cfg, out, before = good
    Path(cfg.dataset).write_text("", encoding="utf-8")
    for tok in ("char", "gpt2"):
        cfg.tokenizer = tok
        user_error(lambda: prepare_data(cfg, progress=False), "no text")
    assert snapshot(out) == before
    assert not any(p.name.endswith(".tmp") for p in out.parent.rglob("*"))
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no empty gpt2 dir left behind


def test_directory_without_txt_files_is_an_empty_source(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus/readme.md").write_text("words", encoding="utf-8")
    user_error(lambda: prepare_data(DataConfig(dataset=str(tmp_path / "corpus"), root=str(tmp_path)), progress=False), "no .txt, .jsonl, .json or .parquet files", "glob")


def test_source_too_small_to_split(tmp_path):
    (tmp_path / "tiny.txt").write_text("hi", encoding="utf-8")
    user_error(lambda: prepare_data(DataConfig(dataset=str(tmp_path / "tiny.txt"), root=str(tmp_path)), progress=False), "val_fraction")


def test_split_shorter_than_block_size_plus_one(good):
    cfg, out, before = good
    val_tokens = load_meta(out)["splits"]["val"]["tokens"]
    user_error(lambda: BatchLoader(out, "val", block_size=val_tokens, batch_size=2, seed=0), "val", "block_size", str(val_tokens))
    BatchLoader(out, "val", block_size=val_tokens - 1, batch_size=2, seed=0)  # the largest that fits works
    assert snapshot(out) == before


def test_corrupt_bin_is_reported_then_rebuilt_by_prepare(good):
    cfg, out, before = good
    with open(first_file(out, "train"), "ab") as f:
        f.write(b"\x00")  # uint16 data with an odd byte count
    user_error(lambda: BatchLoader(out, "train", block_size=8, batch_size=2, seed=0), first_file(out, "train").name,
               "multiple of 2", "data.prepare")
    user_error(lambda: load_meta(out), "corrupt")
    prepare_data(cfg, progress=False)  # corrupt data is not good data: prepare rebuilds it
    assert snapshot(out) == before


def test_bin_shorter_than_meta_says_is_reported(good):
    cfg, out, before = good
    val = first_file(out, "val")
    val.write_bytes(val.read_bytes()[:-2])
    user_error(lambda: load_meta(out), val.name, "tokens", "data.prepare")


def test_meta_disagreeing_with_requested_tokenizer(good, tmp_path):
    cfg, out, before = good
    user_error(lambda: load_meta(out, tokenizer="gpt2"), "'char'", "'gpt2'", "data.tokenizer")
    # A char dir copied to where the gpt2 data would go: prepare must not overwrite it.
    gpt2_dir = out.with_name(out.name.replace("-char", "-gpt2"))
    shutil.copytree(out, gpt2_dir)
    cfg.tokenizer = "gpt2"
    user_error(lambda: prepare_data(cfg, progress=False), str(gpt2_dir), "'char'", "'gpt2'")
    assert snapshot(gpt2_dir) == before and snapshot(out) == before


def test_unknown_tokenizer_name(good):
    cfg, out, before = good
    cfg.tokenizer = "bpe-9000"
    user_error(lambda: prepare_data(cfg, progress=False), "'bpe-9000'", "char", "gpt2")
    assert snapshot(out) == before


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("val_fraction", 1.0, "val_fraction"),
        ("val_fraction", 0, "val_fraction"),
        ("dataset", "hf:", "hf:<name>"),
        ("dataset", " ", "data.dataset"),
        ("num_proc", -1, "num_proc"),
        ("root", "", "data.root"),
    ],
)
def test_bad_config_values(good, field, value, words):
    cfg, out, before = good
    setattr(cfg, field, value)
    user_error(lambda: prepare_data(cfg, progress=False), words)
    assert snapshot(out) == before


def test_non_utf8_file_is_named(good):
    cfg, out, before = good
    Path(cfg.dataset).write_bytes(b"caf\xe9 latin-1 text " * 10)
    user_error(lambda: prepare_data(cfg, progress=False), "src.txt", "UTF-8", "offset 3")
    assert snapshot(out) == before


def _serve(monkeypatch, ds):
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: ds)


def test_hf_source_without_the_text_field(tmp_path, monkeypatch):
    cfg = DataConfig(dataset="hf:x/y", root=str(tmp_path))
    _serve(monkeypatch, datasets.Dataset.from_dict({"content": ["a", "b"], "id": [1, 2]}))
    user_error(lambda: prepare_data(cfg, progress=False), "'text'", "content, id", "data.text_field")

    def rows():
        yield {"body": "streamed text"}

    _serve(monkeypatch, datasets.IterableDataset.from_generator(rows))  # features unknown until read
    cfg.streaming = True
    user_error(lambda: prepare_data(cfg, progress=False), "'text'", "body", "data.text_field")
    assert not any(tmp_path.iterdir())


def test_hf_text_field_holding_non_text(tmp_path, monkeypatch):
    _serve(monkeypatch, datasets.Dataset.from_dict({"text": [1, 2, 3]}))
    user_error(lambda: prepare_data(DataConfig(dataset="hf:x/y", root=str(tmp_path)), progress=False), "row 1", "int", "data.text_field")


def test_hf_dataset_that_cannot_be_loaded(tmp_path, monkeypatch):
    def not_found(*a, **k):
        raise FileNotFoundError("Couldn't find a dataset script at /x/y.py\nor any data file in the same directory.")

    monkeypatch.setattr(datasets, "load_dataset", not_found)
    user_error(lambda: prepare_data(DataConfig(dataset="hf:x/y", root=str(tmp_path)), progress=False), "x/y", "Couldn't find", "hf_split")


def test_no_prepared_data_points_at_prepare(tmp_path):
    user_error(lambda: BatchLoader(tmp_path, "train", block_size=8, batch_size=1, seed=0), "meta.json", "data.prepare")
    (tmp_path / "meta.json").write_text("{not json", encoding="utf-8")
    user_error(lambda: load_meta(tmp_path), "not valid JSON")


@pytest.mark.slow
def test_cli_bad_input_prints_one_error_line_and_no_traceback(tmp_path):
    r = warm_runs.run(["-m", "data.prepare", "--dataset", tmp_path / "missing.txt", "--root", tmp_path], cwd=ROOT)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "missing.txt" in lines[0], r.stderr
    assert r.stdout == ""


def test_a_meta_json_that_is_a_folder_gets_the_right_advice(good):
    """Before: 'cannot write prepared data (IsADirectoryError); free some space', which would not help."""
    cfg, out, _ = good
    (out / "meta.json").unlink()
    (out / "meta.json").mkdir()
    msg = user_error(lambda: prepare_data(cfg, progress=False), "meta.json is not a file", "move it away")
    assert "space" not in msg
    user_error(lambda: load_meta(out), "meta.json is not a file")


# A text row bad in each way the prepare knows: (its line, the fault kind it is counted under, words of its fix)
BAD_TEXT_ROWS = {
    "no text field": st.sampled_from([b'{"body": "hello"}', b'{}']),
    "text field not text": st.sampled_from([b'{"text": 3}', b'{"text": [1]}', b'{"text": {"a": 1}}', b'{"text": true}',
                                            b'{"text": null}', b'{"text": "a\\ud800"}']),  # (null; a lone surrogate)
    "not valid JSON": st.sampled_from([b'{"text": "a"', b"text: a", b'{"text": "a"} x']),
    "not UTF-8": st.sampled_from([b'{"text": "\xff"}', b'{"text": "caf\xe9"}']),
    "not a JSON object": st.sampled_from([b"3", b"null", b"1.5", b'"text"']),  # a first "[" reads as one array
}


@given(data=st.data(), kinds=st.lists(st.sampled_from(sorted(BAD_TEXT_ROWS)), min_size=1, max_size=8),
       tokenizer=st.sampled_from(["char", "gpt2"]), entry=st.sampled_from(["python -m data.prepare", "prepare_data"]))
def test_every_text_row_skipped_as_bad_is_one_line_with_the_count_per_fault(tmp_path_factory, capsys, data, kinds,
                                                                              tokenizer, entry):
    """The class: a jsonl whose rows are all bad, in any mix of the ways a text row can be, with
    data.skip_bad_rows, through either entry point. The one line says all N rows were skipped as bad, the count
    per fault and the first row's fault with its own fix (data.text_field for a missing field), not "contains no
    text; point it at non-empty text"."""
    lines = [data.draw(BAD_TEXT_ROWS[kind]) for kind in kinds]
    tmp = tmp_path_factory.mktemp("allbad")
    path = tmp / "rows.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    if entry == "prepare_data":
        msg = user_error(lambda: prepare_data(DataConfig(dataset=str(path), root=str(tmp / "p"), tokenizer=tokenizer,
                                                         skip_bad_rows=True), progress=False))
    else:
        with pytest.raises(SystemExit):
            run_cli(lambda: prepare_main(["--dataset", str(path), "--root", str(tmp / "p"), "--tokenizer",
                                               tokenizer, "--skip-bad-rows", "--no-progress"]))
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: "), err
        msg = err[len("error: "):-1]
    assert f"all {len(lines)} of its rows with content were skipped as bad" in msg, msg
    for kind in set(kinds):
        assert f"{kinds.count(kind)} {kind}" in msg, (kind, msg)
    assert f"the first, {path}, row 1: " in msg, msg
    if kinds[0] == "no text field":
        assert "set data.text_field" in msg, msg
    assert "point it at non-empty text" not in msg and not (tmp / "p").exists()
