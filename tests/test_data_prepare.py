"""prepare_data(): the bins hold the tokenizer's output of the source, split and described correctly."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import datasets
import pytest
import tiktoken

import data.build
import data.formats
import data.pieces
import data.shards
from data import BatchLoader, DataConfig, load_meta, prepare_data, tokenizer_from_meta
from data.prepare import main as prepare_cli
from prepared_files import read_bins, split_on, tail_cut

ENC = tiktoken.get_encoding("gpt2")
EOT = 50256


def joined_with_eot(docs: list[str]) -> list[int]:
    ids: list[int] = []
    for doc in docs:
        if ids:
            ids.append(EOT)
        ids += ENC.encode_ordinary(doc)
    return ids


def expected_split(text: str, val_fraction: float = 0.1) -> tuple[list[int], list[int]]:
    """A single text file: train is the text before its tail cut, val the rest."""
    cut = tail_cut(text, val_fraction)
    return ENC.encode_ordinary(text[:cut]), ENC.encode_ordinary(text[cut:])


def assert_documents_split(out: Path, docs: list[str], eot: int = EOT, encode=ENC.encode_ordinary) -> tuple[list, list]:
    """Every document lies whole in exactly one split, in source order within it; -> (train, val) docs' ids."""
    train, val = (split_on(ids, eot) for ids in read_bins(out))
    expected = [encode(d) for d in docs if d]
    assert sorted(train + val) == sorted(expected)
    assert train == [e for e in expected if e in train] and val == [e for e in expected if e in val]
    return train, val


@pytest.fixture(scope="module")
def shakespeare_gpt2(tmp_path_factory):
    return prepare_data(DataConfig(root=str(tmp_path_factory.mktemp("prepared"))), progress=False)


# --- tiny shakespeare -----------------------------------------------------------------------------


def test_shakespeare_gpt2_bins_are_tiktoken_tokens_with_the_last_tenth_as_val(shakespeare_gpt2, shakespeare_path):
    text = shakespeare_path.read_text(encoding="utf-8")
    ids = ENC.encode_ordinary(text)
    assert shakespeare_gpt2.name == "shakespeare-gpt2"
    train, val = read_bins(shakespeare_gpt2)
    assert (train, val) == expected_split(text) and train + val == ids  # cut where the tokens don't change
    assert 0.0999 < len(ENC.decode_bytes(val)) / len(text.encode()) <= 0.1
    meta = load_meta(shakespeare_gpt2)
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot"], meta["dtype"], meta["chars"]) == ("gpt2", 50257, EOT, "uint16", None)
    assert meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"] == len(ids)


def test_split_bytes_are_the_utf8_size_of_each_splits_text(shakespeare_gpt2, shakespeare_path):
    train, val = read_bins(shakespeare_gpt2)
    splits = load_meta(shakespeare_gpt2)["splits"]
    assert splits["val"]["bytes"] == len(ENC.decode_bytes(val))
    assert splits["train"]["bytes"] == len(ENC.decode_bytes(train))
    assert splits["train"]["bytes"] + splits["val"]["bytes"] == shakespeare_path.stat().st_size == 1_115_394


def test_shakespeare_char_vocab_is_saved_and_reloaded(tmp_path, shakespeare_path):
    text = shakespeare_path.read_text(encoding="utf-8")
    out = prepare_data(DataConfig(tokenizer="char", root=str(tmp_path)), progress=False)
    assert out.name == "shakespeare-char"
    chars = "".join(sorted(set(text)))
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["chars"], meta["vocab_size"], meta["eot"]) == (chars, len(chars) + 1, len(chars))
    cut = tail_cut(text, 0.1)
    assert read_bins(out) == ([chars.index(c) for c in text[:cut]], [chars.index(c) for c in text[cut:]])
    tok = tokenizer_from_meta(load_meta(out))
    train, val = read_bins(out)
    assert tok.decode(train + val) == text


def test_prepare_skips_work_when_nothing_changed(shakespeare_gpt2, capsys):
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in shakespeare_gpt2.iterdir()}
    again = prepare_data(DataConfig(root=str(shakespeare_gpt2.parent)), progress=True)
    assert again == shakespeare_gpt2
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in shakespeare_gpt2.iterdir()} == before
    assert "up to date" in capsys.readouterr().err


def test_shakespeare_is_downloaded_once_into_the_cache(tmp_path, monkeypatch, shakespeare_path):
    monkeypatch.delenv("SMALLGPT_SHAKESPEARE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls = []

    def fake_urlopen(url, timeout=None):
        calls.append(url)
        return io.BytesIO(shakespeare_path.read_bytes())

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    cfg = DataConfig(tokenizer="char", root=str(tmp_path / "prepared"))
    prepare_data(cfg, progress=False)
    cached = tmp_path / "cache/smallgpt/tinyshakespeare/input.txt"
    assert calls == ["https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"]
    assert cached.read_bytes() == shakespeare_path.read_bytes()
    cfg.val_fraction = 0.2  # forces a rebuild, which reads the source again: from the cache this time
    prepare_data(cfg, progress=False)
    assert len(calls) == 1


def test_local_path_config_field_points_at_shakespeare(tmp_path, monkeypatch, shakespeare_path):
    monkeypatch.delenv("SMALLGPT_SHAKESPEARE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("downloaded"))
    out = prepare_data(DataConfig(tokenizer="char", root=str(tmp_path), local_path=str(shakespeare_path)), progress=False)
    text = shakespeare_path.read_text(encoding="utf-8")
    assert load_meta(out)["splits"]["val"]["tokens"] == len(text) - tail_cut(text, 0.1)


# --- local files ----------------------------------------------------------------------------------


DOCS = {
    "b.txt": "Second document.\nWith two lines.\n",
    "a.txt": "First: naïve café 🎉🚀\r\nwindows line\n",
    "sub/c.txt": "Third, in a subdirectory. 12345 67890",
    "empty.txt": "",
    "notes.md": "not a .txt file",
}


@pytest.fixture
def doc_dir(tmp_path) -> Path:
    root = tmp_path / "corpus"
    for name, text in DOCS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(text.encode("utf-8"))
    return root


def test_directory_documents_are_joined_by_eot_in_path_order(doc_dir, tmp_path):
    out = prepare_data(DataConfig(dataset=str(doc_dir), root=str(tmp_path / "p"), val_fraction=0.5), progress=False)
    train, val = assert_documents_split(out, [DOCS["a.txt"], DOCS["b.txt"], DOCS["sub/c.txt"]])
    assert train and val
    meta = load_meta(out)
    assert meta["documents"] == 3
    texts = b"".join(DOCS[n].encode() for n in ("a.txt", "b.txt", "sub/c.txt"))
    assert meta["splits"]["train"]["bytes"] + meta["splits"]["val"]["bytes"] == len(texts)
    assert out.name.startswith("corpus-") and out.name.endswith("-gpt2-val0.5")


def test_glob_source_takes_only_matching_files(doc_dir, tmp_path):
    (doc_dir / "sub/more.md").write_text("another markdown file", encoding="utf-8")
    out = prepare_data(DataConfig(dataset=str(doc_dir / "**/*.md"), root=str(tmp_path / "p"), val_fraction=0.5), progress=False)
    assert_documents_split(out, [DOCS["notes.md"], "another markdown file"])


def test_single_file_source_is_one_document(doc_dir, tmp_path):
    out = prepare_data(DataConfig(dataset=str(doc_dir / "a.txt"), root=str(tmp_path / "p"), val_fraction=0.2), progress=False)
    train, val = read_bins(out)
    assert train + val == ENC.encode_ordinary(DOCS["a.txt"])


def test_char_tokenizer_separates_documents_with_its_reserved_eot(doc_dir, tmp_path):
    out = prepare_data(DataConfig(dataset=str(doc_dir), tokenizer="char", root=str(tmp_path / "p"), val_fraction=0.5),
                       progress=False)
    docs = [DOCS["a.txt"], DOCS["b.txt"], DOCS["sub/c.txt"]]
    chars = "".join(sorted(set("".join(docs))))
    assert_documents_split(out, docs, eot=len(chars), encode=lambda d: [chars.index(c) for c in d])
    assert load_meta(out)["chars"] == chars


def test_long_document_tokenized_in_pieces_equals_tokenizing_it_whole(tmp_path, monkeypatch, shakespeare_path):
    # Tiny pieces and batches force hundreds of cuts and several thread-pool batches.
    monkeypatch.setattr(data.pieces, "CHUNK_CHARS", 300)
    monkeypatch.setattr(data.formats, "READ_BYTES", 97)
    monkeypatch.setattr(data.shards, "BATCH_CHARS", 2000)
    extra = "numbers 1234567 89,012 and  double  spaces\n\n\n  indented\n\tTab 🎉🎉 emoji’s  café\r\n" * 40
    text = shakespeare_path.read_text(encoding="utf-8")[:30_000] + extra
    (tmp_path / "long.txt").write_text(text, encoding="utf-8", newline="")
    cfg = DataConfig(dataset=str(tmp_path / "long.txt"), root=str(tmp_path / "p"), num_proc=2)
    train, val = read_bins(prepare_data(cfg, progress=False))
    assert train + val == ENC.encode_ordinary(text)


def test_text_without_any_cut_point_is_still_kept_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(data.pieces, "CHUNK_CHARS", 100)
    text = "x" * 1000 + "🎉" * 333
    (tmp_path / "blob.txt").write_text(text, encoding="utf-8")
    out = prepare_data(DataConfig(dataset=str(tmp_path / "blob.txt"), root=str(tmp_path / "p")), progress=False)
    train, val = read_bins(out)
    assert ENC.decode(train + val) == text


def test_a_rebuild_names_the_source_files_that_changed(tmp_path, capsys):
    """Found from outside: every rebuild said only "the source or the split settings changed", where the resume
    check named the files. The line names each file edited, new or gone."""
    src = tmp_path / "docs"
    src.mkdir()
    for name in ("a", "b", "c"):
        (src / f"{name}.txt").write_text(f"Document {name}, with words enough to tokenize.\n" * 3)
    cfg = DataConfig(dataset=str(src), root=str(tmp_path / "p"), tokenizer="char", val_fraction=0.3)
    out = prepare_data(cfg, progress=False)
    (src / "a.txt").write_text("Document a, edited.\n" * 3)
    (src / "d.txt").write_text("Document d, new.\n" * 3)
    (src / "c.txt").unlink()
    capsys.readouterr()
    prepare_data(cfg, progress=False)
    line = next(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("rebuilding"))
    assert line.startswith(f"rebuilding {out}: the source files ") and line.endswith(" changed since it was prepared")
    for name, how in (("a", "edited"), ("c", "gone"), ("d", "new")):
        assert f"{src / name}.txt ({how})" in line, line
    assert "b.txt" not in line


def test_prepare_rebuilds_when_the_source_changes(doc_dir, tmp_path, capsys):
    cfg = DataConfig(dataset=str(doc_dir / "b.txt"), root=str(tmp_path / "p"), val_fraction=0.2)
    out = prepare_data(cfg, progress=False)
    new_text = "An entirely different text, now somewhat longer than before.\n"
    (doc_dir / "b.txt").write_text(new_text, encoding="utf-8")
    assert prepare_data(cfg, progress=False) == out
    train, val = read_bins(out)
    assert train + val == ENC.encode_ordinary(new_text)
    assert "rebuilding" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        ["meta.json"] + [sh["name"] for s in ("train", "val") for sh in json.loads((out / "meta.json").read_text())["shards"][s]])


def test_another_val_fraction_is_another_dir_and_the_first_stays(doc_dir, tmp_path):
    cfg = DataConfig(dataset=str(doc_dir / "a.txt"), root=str(tmp_path / "p"), val_fraction=0.1)
    first = prepare_data(cfg, progress=False)
    before = read_bins(first)
    cfg.val_fraction = 0.5
    second = prepare_data(cfg, progress=False)
    assert second != first and read_bins(first) == before
    assert read_bins(second) == expected_split(DOCS["a.txt"], 0.5)


def test_vocab_over_65536_is_stored_as_uint32_and_loads_back(tmp_path):
    # 70,000 distinct characters make a char vocab that does not fit uint16.
    chars = "".join(chr(c) for c in range(0x10000, 0x10000 + 70_000))
    (tmp_path / "wide.txt").write_text(chars + " " + chars[::-1], encoding="utf-8")
    out = prepare_data(DataConfig(dataset=str(tmp_path / "wide.txt"), tokenizer="char", root=str(tmp_path / "p"), val_fraction=0.5), progress=False)
    assert load_meta(out)["dtype"] == "uint32"
    train, val = read_bins(out)
    assert train == list(range(1, 70_001)) and val == [0] + list(range(1, 70_001))[::-1]  # id 0 is the space
    x, y = BatchLoader(out, "train", block_size=8, batch_size=4, seed=0).get_batch(0)
    assert ((y[:, :-1] == x[:, 1:]).all() and (x[:, 1:] - x[:, :-1] == 1).all())


def test_cli_prepares_and_prints_the_directory(tmp_path, capsys):
    (tmp_path / "doc.txt").write_text("hello there, general kenobi " * 10, encoding="utf-8")
    assert prepare_cli(["--dataset", str(tmp_path / "doc.txt"), "--tokenizer", "char", "--root", str(tmp_path / "p"), "--val-fraction", "0.2", "--no-progress"]) == 0
    out = Path(capsys.readouterr().out.strip())
    assert out.parent == tmp_path / "p" and load_meta(out)["tokenizer"] == "char"


# --- HF datasets ----------------------------------------------------------------------------------

HF_DOCS = ["The first story. It is short.", "", "Another story, with émoji 🐉.", None, "Last one!", "Or not quite.",
           "A sixth story", "the seventh", "8"]
HF_TEXT = [d for d in HF_DOCS if d]  # empty and missing rows are skipped


@pytest.fixture
def fake_hub(monkeypatch):
    """Make datasets.load_dataset hand back a local object; record how it was called."""
    calls = []

    def serve(ds):
        def load_dataset(name, subset=None, **kwargs):
            calls.append((name, subset, kwargs))
            return ds

        monkeypatch.setattr(datasets, "load_dataset", load_dataset)
        return calls

    return serve


def test_hf_dataset_rows_are_documents_joined_by_eot(fake_hub, tmp_path):
    calls = fake_hub(datasets.Dataset.from_dict({"text": HF_DOCS, "id": list(range(len(HF_DOCS)))}))
    cfg = DataConfig(dataset="hf:someone/stories", hf_subset="en", hf_split="train", root=str(tmp_path), val_fraction=0.5)
    out = prepare_data(cfg, progress=False)
    assert calls == [("someone/stories", "en", {"split": "train", "streaming": False})]
    assert out.name == "hf-someone-stories-en-train-gpt2-val0.5"
    assert_documents_split(out, HF_TEXT)
    assert load_meta(out)["documents"] == len(HF_TEXT)


def test_hf_streaming_gives_the_same_bins_as_downloading(fake_hub, tmp_path):
    ds = datasets.Dataset.from_dict({"story": HF_DOCS})
    fake_hub(ds)
    cfg = DataConfig(dataset="hf:x/y", text_field="story", root=str(tmp_path / "a"), val_fraction=0.5)
    downloaded = read_bins(prepare_data(cfg, progress=False))
    calls = fake_hub(ds.to_iterable_dataset())
    cfg.streaming, cfg.root = True, str(tmp_path / "b")
    assert read_bins(prepare_data(cfg, progress=False)) == downloaded
    assert calls[-1][2]["streaming"] is True


def test_hf_streaming_source_that_is_up_to_date_is_not_opened_again(fake_hub, tmp_path):
    calls = fake_hub(datasets.Dataset.from_dict({"text": HF_TEXT}).to_iterable_dataset())
    cfg = DataConfig(dataset="hf:x/y", streaming=True, root=str(tmp_path), val_fraction=0.5)
    first = prepare_data(cfg, progress=False)
    assert prepare_data(cfg, progress=False) == first
    assert len(calls) == 1  # the second, up-to-date prepare needed no hub access


def test_hf_text_builder_on_local_files_gives_one_document_per_line(fake_hub, tmp_path):
    (tmp_path / "lines.txt").write_text("line one\nline two\n\nline four\n", encoding="utf-8")
    ds = datasets.load_dataset("text", data_files=str(tmp_path / "lines.txt"), split="train", cache_dir=str(tmp_path / "hf-cache"))
    fake_hub(ds)
    out = prepare_data(DataConfig(dataset="hf:x/lines", root=str(tmp_path / "p"), val_fraction=0.5), progress=False)
    assert_documents_split(out, ["line one", "line two", "line four"])


def test_hf_changed_content_triggers_a_rebuild(fake_hub, tmp_path):
    cfg = DataConfig(dataset="hf:x/y", root=str(tmp_path), val_fraction=0.2)
    fake_hub(datasets.Dataset.from_dict({"text": ["one document here", "and another one"]}))
    prepare_data(cfg, progress=False)
    fake_hub(datasets.Dataset.from_dict({"text": ["different documents now", "really", "and a third one", "a fourth"]}))
    assert_documents_split(prepare_data(cfg, progress=False), ["different documents now", "really", "and a third one", "a fourth"])


def test_hf_long_rows_are_tokenized_in_pieces_exactly(fake_hub, tmp_path, monkeypatch, shakespeare_path):
    monkeypatch.setattr(data.pieces, "CHUNK_CHARS", 250)
    rows = [shakespeare_path.read_text(encoding="utf-8")[:6000], "short row", "x" * 10 + " after\nit", "one more row"]
    fake_hub(datasets.Dataset.from_dict({"text": rows}))
    assert_documents_split(prepare_data(DataConfig(dataset="hf:x/y", root=str(tmp_path), val_fraction=0.5), progress=False), rows)


def test_hf_num_proc_is_passed_to_load_dataset(fake_hub, tmp_path):
    calls = fake_hub(datasets.Dataset.from_dict({"text": ["some words to tokenize", "more words", "a third", "fourth"]}))
    prepare_data(DataConfig(dataset="hf:x/y", root=str(tmp_path), num_proc=2, val_fraction=0.5), progress=False)
    assert calls[0][2] == {"split": "train", "streaming": False, "num_proc": 2}


def test_prepared_files_get_normal_permissions(shakespeare_gpt2):
    umask = os.umask(0)
    os.umask(umask)
    for p in shakespeare_gpt2.iterdir():
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask


def test_dir_left_without_meta_json_is_rebuilt(doc_dir, tmp_path, capsys):
    # what a crash between swapping in the bins and writing meta.json leaves behind
    cfg = DataConfig(dataset=str(doc_dir), root=str(tmp_path / "p"), val_fraction=0.5)
    out = prepare_data(cfg, progress=False)
    good = read_bins(out)
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").unlink()
    (out / meta["shards"]["val"][0]["name"]).write_bytes(b"")
    assert read_bins(prepare_data(cfg, progress=False)) == good
    assert "meta.json is missing" in capsys.readouterr().err


@pytest.mark.slow
def test_importing_data_loads_no_torch_or_datasets_and_does_nothing():
    code = "import sys, data; print(sorted(m for m in ('torch', 'datasets', 'tqdm') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "[]", "")
