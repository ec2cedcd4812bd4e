"""Users' own corpora: jsonl / json / parquet files (plain, .gz, .zst), folders and globs of them, datasets
saved with save_to_disk, a separate val source; the val split by document; the sharded format v2."""
from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import data.formats
import data.prepare
from data import BatchLoader, DataConfig, load_meta, prepare_data
from errors import UserError
from prepared_files import read_bins, read_split, split_on
import warm_runs

ENC = tiktoken.get_encoding("gpt2")
EOT = 50256
FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[1]

DOCS = [f"Document number {i}: " + ["plain words here.", "naïve café 🎉 emoji’s", "Ελληνικά και русский текст",
                                     "日本語のテキストです。", "tabs\tand\r\nnewlines\n\n  spaced  "][i % 5] * (1 + i % 3)
        for i in range(24)]


def ids_of(docs: list[str]) -> list[list[int]]:
    return [ENC.encode_ordinary(d) for d in docs if d]


def documents(out: Path) -> tuple[list[list[int]], list[list[int]]]:
    return tuple(split_on(ids, EOT) for ids in read_bins(out))


def assert_same_documents(out: Path, docs: list[str]) -> None:
    """Both splits together hold exactly the tiktoken tokens of each document, in source order per split."""
    train, val = documents(out)
    expected = ids_of(docs)
    assert sorted(train + val) == sorted(expected)
    assert train == [e for e in expected if e in train] and val == [e for e in expected if e in val]
    assert train and val


def write_jsonl(path: Path, rows: list[dict], opener=open) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with opener(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def write_zst(path: Path, data: bytes) -> Path:
    with pa.output_stream(str(path), compression="zstd") as f:
        f.write(data)
    return path


def cfg(dataset, root: Path, **kw) -> DataConfig:
    kw.setdefault("val_fraction", 0.3)
    return DataConfig(dataset=str(dataset), root=str(root), **kw)


# --- each form gives tiktoken's tokens of its documents ----------------------------------------------


@pytest.mark.parametrize("form", ["jsonl-glob", "jsonl.gz", "jsonl.zst", "json-array", "parquet", "folder", "txt.gz"])
def test_each_source_form_gives_tiktoken_tokens_of_its_documents(tmp_path, form):
    rows = [{"id": i, "text": d, "meta": {"n": i}} for i, d in enumerate(DOCS)]
    src = tmp_path / "corpus"
    src.mkdir()
    docs = DOCS
    if form == "jsonl-glob":  # corpus/*.jsonl: the rows' text, never the JSON syntax
        write_jsonl(src / "a.jsonl", rows[:10])
        write_jsonl(src / "b.jsonl", rows[10:])
        dataset = src / "*.jsonl"
    elif form == "jsonl.gz":
        dataset = write_jsonl(src / "a.jsonl.gz", rows, opener=gzip.open)
    elif form == "jsonl.zst":
        dataset = write_zst(src / "a.jsonl.zst", "".join(json.dumps(r) + "\n" for r in rows).encode())
    elif form == "json-array":
        dataset = src / "a.json"
        dataset.write_text(json.dumps(rows), encoding="utf-8")
    elif form == "parquet":
        dataset = src / "a.parquet"
        pq.write_table(pa.table({"id": list(range(len(DOCS))), "text": DOCS}), dataset, row_group_size=5)
    elif form == "folder":  # every supported file below it, in path order
        write_jsonl(src / "1.jsonl", rows[:8])
        pq.write_table(pa.table({"text": DOCS[8:16]}), src / "2.parquet")
        write_jsonl(src / "sub" / "3.jsonl.gz", rows[16:], opener=gzip.open)
        (src / "notes.md").write_text("not a corpus file", encoding="utf-8")
        dataset = src
    else:  # one text file per document, compressed
        for i, d in enumerate(DOCS):
            with gzip.open(src / f"{i:02d}.txt.gz", "wt", encoding="utf-8", newline="") as f:
                f.write(d)
        dataset = src
    out = prepare_data(cfg(dataset, tmp_path / "p"), progress=False)
    assert_same_documents(out, docs)
    assert b"{\"id\"" not in ENC.decode_bytes(read_split(out, "train"))


WORDS = st.lists(st.text("abé日🎉.", min_size=1, max_size=7), min_size=12, max_size=60)


@given(words=WORDS, seps=st.lists(st.sampled_from([" ", "\n", "  ", "\n\n"]), min_size=60, max_size=60),
       compression=st.sampled_from(["gz", "zst"]), val_fraction=st.sampled_from([0.1, 0.25, 0.5]),
       entry=st.sampled_from(["python -m data.prepare", "prepare_data"]))
def test_a_compressed_single_text_file_splits_by_its_tail_as_the_plain_one(tmp_path_factory, words, seps,
                                                                           compression, val_fraction, entry):
    """The class: any single text file, .gz or .zst, through either entry point (the CLI, and prepare_data as
    train.py calls it) splits by the tail of its text exactly as the plain file does (the same tokens in each
    split), and the two splits are the whole text's characters, in order, with a non-empty val."""
    tmp = tmp_path_factory.mktemp("tail")
    text = "".join(w + sep for w, sep in zip(words, seps)).strip() + "\n"
    (tmp / "plain").mkdir()
    (tmp / "packed").mkdir()
    plain = tmp / "plain" / "t.txt"
    plain.write_text(text, encoding="utf-8")
    packed = tmp / "packed" / f"t.txt.{compression}"
    if compression == "gz":
        packed.write_bytes(gzip.compress(text.encode("utf-8")))
    else:
        write_zst(packed, text.encode("utf-8"))

    def prepared(path: Path) -> tuple[list[int], list[int]]:
        settings = dict(tokenizer="char", val_fraction=val_fraction)
        root = path.parent / "prep"
        if entry == "prepare_data":
            out = prepare_data(cfg(path, root, **settings), progress=False)
        else:
            assert data.prepare.main(["--dataset", str(path), "--root", str(root), "--tokenizer", "char",
                                      "--val-fraction", str(val_fraction), "--no-progress"]) in (0, None)
            (out,) = root.iterdir()
        chars = load_meta(out)["chars"]
        return tuple("".join(chars[i] for i in ids) for ids in read_bins(out))

    train, val = prepared(packed)
    assert (train, val) == prepared(plain)
    assert train + val == text and val


def test_text_field_names_the_field_that_holds_the_text(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"content": d, "text": "not this"} for d in DOCS])
    assert_same_documents(prepare_data(cfg(path, tmp_path / "p", text_field="content"), progress=False), DOCS)


def test_a_dataset_saved_with_save_to_disk_is_read_with_load_from_disk(tmp_path):
    datasets.Dataset.from_dict({"text": DOCS, "n": list(range(len(DOCS)))}).save_to_disk(str(tmp_path / "saved"))
    assert_same_documents(prepare_data(cfg(tmp_path / "saved", tmp_path / "p"), progress=False), DOCS)
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCS}),
                          "test": datasets.Dataset.from_dict({"text": ["x"]})}).save_to_disk(str(tmp_path / "dict"))
    out = prepare_data(cfg(f"hf:{tmp_path / 'dict'}", tmp_path / "q"), progress=False)  # the hf: spelling works too
    assert_same_documents(out, DOCS)
    with pytest.raises(UserError, match=r"no split 'validation' \(splits: train, test\)"):
        prepare_data(cfg(tmp_path / "dict", tmp_path / "r", hf_split="validation"), progress=False)


def test_val_dataset_is_the_val_split_and_all_of_dataset_is_train(tmp_path):
    train_src = write_jsonl(tmp_path / "train.jsonl", [{"text": d} for d in DOCS[:20]])
    val_src = write_jsonl(tmp_path / "val.jsonl.gz", [{"text": d} for d in DOCS[20:]], opener=gzip.open)
    out = prepare_data(cfg(train_src, tmp_path / "p", val_dataset=str(val_src)), progress=False)
    train, val = documents(out)
    assert (train, val) == (ids_of(DOCS[:20]), ids_of(DOCS[20:]))
    assert load_meta(out)["val_dataset"] == str(val_src)


SAME_FILES = {  # spellings of the corpus folder, or of files in it: each overlaps with every other
    "folder": "corpus", "slash": "corpus/", "dot": "./corpus", "dotdot": "corpus/../corpus", "abs": "{abs}/corpus",
    "link": "linked", "glob": "corpus/*.txt", "one file": "corpus/b.txt", "one by link": "linked/a.txt",
}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(train=st.sampled_from(sorted(SAME_FILES)), val=st.sampled_from(sorted(SAME_FILES)))
def test_a_val_dataset_that_reads_training_files_is_refused_however_it_is_spelled(tmp_path, monkeypatch, train, val):
    """'corpus/' and './corpus' (or a file of the training folder) were accepted as a separate val source: the
    val split was training data, and every val loss a train loss. Refused in one line, nothing prepared."""
    if not (tmp_path / "corpus").exists():
        (tmp_path / "corpus").mkdir()
        for name in "abc":
            (tmp_path / "corpus" / f"{name}.txt").write_text(f"text {name} " * 50)
        (tmp_path / "linked").symlink_to(tmp_path / "corpus")
    monkeypatch.chdir(tmp_path)
    spell = {k: v.format(abs=tmp_path) for k, v in SAME_FILES.items()}
    if spell[train] == spell[val]:
        return  # the config refuses the same text already (tests/test_config.py)
    with pytest.raises(UserError) as e:
        prepare_data(DataConfig(dataset=spell[train], val_dataset=spell[val], root="p", tokenizer="char"), progress=False)
    assert "\n" not in str(e.value) and "data.val_dataset and data.dataset both read" in str(e.value), str(e.value)
    assert not Path("p").exists()
    apart = tmp_path / "val.txt"
    apart.write_text("held out text " * 20)
    if train not in ("one file", "one by link"):
        prepare_data(DataConfig(dataset=spell[train], val_dataset=str(apart), root="p2", tokenizer="char"), progress=False)


# --- bad rows -----------------------------------------------------------------------------------------

BAD_ROWS = {
    "missing": (b'{"id": 3}', "no 'text' field"),
    "null": (b'{"text": null}', "'text' field is null, not text"),  # (it said "no 'text' field: set data.text_field")
    "number": (b'{"text": 12}', "'text' field is an int, not text"),
    "surrogate": (b'{"text": "bad \\ud800 here"}', "'text' field has a lone surrogate (\\ud800 at character 4)"),
    "syntax": (b'{"text": "unterminated}', "not valid JSON"),
    "utf8": (b'{"text": "caf\xe9"}', "not UTF-8"),
    "array": (b'[1, 2]', "not an object"),
}


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_a_bad_jsonl_row_is_one_line_naming_file_and_row(tmp_path, kind):
    bad, words = BAD_ROWS[kind]
    lines = [json.dumps({"text": d}).encode() for d in DOCS[:6]]
    lines.insert(4, b"")  # a blank line is no row, but the row number is the file's line number
    lines.insert(5, bad)
    (tmp_path / "c.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(UserError) as e:
        prepare_data(cfg(tmp_path / "c.jsonl", tmp_path / "p"), progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "c.jsonl, row 6: " in msg and words in msg and "data.skip_bad_rows" in msg, msg
    assert not (tmp_path / "p").exists() or not any((tmp_path / "p").iterdir())


@pytest.mark.parametrize("tokenizer", ["char", "bpe:512", "gpt2"])
@pytest.mark.parametrize("form", ["jsonl", "json"])
def test_a_lone_surrogate_in_a_text_row_is_a_bad_row_for_every_tokenizer(tmp_path, tokenizer, form):
    """JSON's "\\ud800" escape is valid JSON but no text (found from outside: char and bpe:N ended in a
    UnicodeEncodeError traceback, even with data.skip_bad_rows, and GPT-2's tokenizer stored U+FFFD without a
    word): one line naming the row and the character, or, with data.skip_bad_rows, the row skipped and counted."""
    rows = [{"text": d} for d in DOCS[:6]]
    text = "\n".join(json.dumps(r) for r in rows[:3] + [{"text": "bad \ud800 here"}] + rows[3:])
    path = tmp_path / f"c.{form}"
    path.write_text(text + "\n" if form == "jsonl" else "[" + text.replace("\n", ",\n") + "]")
    with pytest.raises(UserError) as e:
        prepare_data(cfg(path, tmp_path / "p", tokenizer=tokenizer), progress=False)
    assert "\n" not in str(e.value) and "lone surrogate (\\ud800 at character 4)" in str(e.value), str(e.value)
    out = prepare_data(cfg(path, tmp_path / "q", tokenizer=tokenizer, skip_bad_rows=True), progress=False)
    meta = load_meta(out)
    assert meta["skipped_rows"]["count"] == 1 and "\ufffd" not in (meta.get("chars") or "")


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
def test_a_row_over_the_bound_is_refused_in_one_line_without_reading_it_whole(tmp_path, monkeypatch, suffix):
    import data.formats

    monkeypatch.setattr(data.formats, "ROW_MAX_BYTES", 1000)
    raw = b"\n".join([json.dumps({"text": "short"}).encode(), json.dumps({"text": "y" * 5000}).encode()]) + b"\n"
    path = tmp_path / f"c{suffix}"
    write_zst(path, raw) if suffix.endswith(".zst") else path.write_bytes(raw)
    with pytest.raises(UserError) as e:
        prepare_data(cfg(path, tmp_path / "p"), progress=False)
    msg = str(e.value)
    assert "\n" not in msg and f"c{suffix}, row 2: it is over" in msg and "split that document" in msg, msg


def test_a_bad_parquet_row_is_one_line_naming_file_and_row(tmp_path):
    pq.write_table(pa.table({"text": DOCS[:4] + [None] + DOCS[4:]}), tmp_path / "c.parquet", row_group_size=3)
    with pytest.raises(UserError, match=r"c\.parquet, row 5: its 'text' field is null, not text"):
        prepare_data(cfg(tmp_path / "c.parquet", tmp_path / "p"), progress=False)
    pq.write_table(pa.table({"text": list(range(5))}), tmp_path / "n.parquet")
    with pytest.raises(UserError, match=r"n\.parquet's column 'text' holds int64, not text; set data.text_field"):
        prepare_data(cfg(tmp_path / "n.parquet", tmp_path / "p"), progress=False)
    with pytest.raises(UserError, match=r"has no column 'body' \(columns: text\)"):
        prepare_data(cfg(tmp_path / "c.parquet", tmp_path / "p", text_field="body"), progress=False)


# a child that prepares argv[2] into argv[3] with its address space capped 1 GiB above its imports: a source
# decoded whole is a MemoryError (or pyarrow's) there, not gigabytes of the test machine's memory
CAPPED_PREPARE = """
import resource, sys
sys.path.insert(0, sys.argv[1])
from data import DataConfig, prepare_data
from errors import UserError
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30) if hard < 0 else min(vm + (1 << 30), hard), hard))
try:
    prepare_data(DataConfig(dataset=sys.argv[2], root=sys.argv[3], tokenizer="char", format=sys.argv[4]), progress=False)
except UserError as e:
    print(e)
"""


def capped_prepare(dataset: Path, root: Path, format: str = "text") -> str:
    r = warm_runs.run(["-c", CAPPED_PREPARE, ROOT, dataset, root, format])
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_a_parquet_file_that_decodes_to_gigabytes_is_refused_by_arithmetic_before_decoding(tmp_path):
    """367 bytes (zstd, one dictionary value of 1 MiB used by 8192 rows) decode to 8 GiB of text: refused in one line
    naming the file and the row, before the text is made (it was 4.5 GB of memory, then "damaged")."""
    text = "the cat sat. " * (2**20 // 13)
    rows = pa.DictionaryArray.from_arrays(pa.array([0] * 8192, pa.int32()), pa.array([text]))
    bomb = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"text": rows}), bomb, compression="zstd", use_dictionary=True, store_schema=False)
    assert bomb.stat().st_size < 1000
    line = capped_prepare(bomb, tmp_path / "p")
    assert "\n" not in line and line.startswith(f"{bomb}: its 'text' column decodes to over") and "by row " in line, line
    assert "JSON Lines" in line


def test_a_parquet_row_over_the_row_limit_is_one_line_naming_it(tmp_path, monkeypatch):
    """As a JSON Lines row: a cell over ROW_MAX_BYTES is refused by its length, before it is a string."""
    monkeypatch.setattr(data.formats, "ROW_MAX_BYTES", 1000)
    for dictionary in (False, True):
        path = tmp_path / f"c{dictionary}.parquet"
        pq.write_table(pa.table({"text": DOCS[:2] + ["x" * 1001] + DOCS[2:]}), path, use_dictionary=dictionary)
        with pytest.raises(UserError, match=rf"^{path}, row 3: it is 1,001 bytes, over the 1,000 a document may be; "
                                            "split that document into several rows$"):
            prepare_data(cfg(path, tmp_path / "p"), progress=False)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=40), group=st.integers(1, 9),
       dictionary=st.booleans(), slice_bytes=st.integers(1, 200), rows=st.integers(1, 8))
def test_parquet_rows_decoded_a_bounded_slice_at_a_time_are_the_documents(tmp_path_factory, monkeypatch, lengths, group,
                                                                           dictionary, slice_bytes, rows):
    """A legit corpus of many rows still prepares whole, whatever the batch and slice sizes: the tokens are
    tiktoken's of each row (the reference), and no slice made into strings held more than the bound (or one row)."""
    tmp = tmp_path_factory.mktemp("pq")
    docs = [DOCS[i % len(DOCS)][:n] + f" {i}" for i, n in enumerate(lengths)] + DOCS  # (DOCS: both splits get some)
    pq.write_table(pa.table({"text": docs}), tmp / "c.parquet", row_group_size=group, use_dictionary=dictionary)
    monkeypatch.setattr(data.formats, "PARQUET_SLICE_BYTES", slice_bytes)
    monkeypatch.setattr(data.formats, "PARQUET_ROWS", rows)
    held, rows_of = [], data.formats._parquet_rows
    monkeypatch.setattr(data.formats, "_parquet_rows",
                        lambda column, *a: (held.append((len(column), sum(data.formats._cell_bytes(column)))),
                                            rows_of(column, *a))[1])
    out = prepare_data(cfg(tmp / "c.parquet", tmp / "p"), progress=False)
    assert_same_documents(out, docs)
    assert sum(n for n, _ in held) == len(docs) and all(n == 1 or b <= slice_bytes for n, b in held), held


def test_json_that_costs_gigabytes_to_parse_is_refused_before_parsing(tmp_path):
    """A JSON array is parsed whole: one over JSON_ARRAY_MAX (64 MiB; it was 1 GiB, ~30 GB to parse) is refused by
    its size, pointing at JSON Lines; a row of JSON Lines is refused by what parsing it would cost (parse_cost),
    not by parsing it (a 60 MB '{"messages":[{},{},...]}' took ~1.7 GB)."""
    array = tmp_path / "a.json"
    array.write_bytes(b"[" + b"{}," * ((70 << 20) // 3) + b"{}]")
    line = capped_prepare(array, tmp_path / "p")
    assert line == (f"{array} is one JSON array of {array.stat().st_size:,} bytes, over the 67,108,864 one is read at "
                    "once; convert it to JSON Lines, which are read a row at a time: jq -c '.[]' a.json > rows.jsonl")
    chat = tmp_path / "c.jsonl"
    chat.write_bytes(b'{"messages":[' + b"{}," * (20 << 20) + b'{}]}\n')
    line = capped_prepare(chat, tmp_path / "p", "chat")
    assert line.startswith(f"{chat}, row 1: parsing its {chat.stat().st_size:,} bytes of JSON would take ~"), line
    assert "over the 1,024 MiB one document may; split that document into several rows" in line, line


def test_skip_bad_rows_skips_them_and_counts_them(tmp_path):
    lines = [json.dumps({"text": d}).encode() for d in DOCS] + [bad for bad, _ in BAD_ROWS.values()]
    (tmp_path / "c.jsonl").write_bytes(b"\n".join(lines[:10] + lines[24:] + lines[10:24]) + b"\n")
    out = prepare_data(cfg(tmp_path / "c.jsonl", tmp_path / "p", skip_bad_rows=True), progress=False)
    assert_same_documents(out, DOCS)
    skipped = load_meta(out)["skipped_rows"]
    assert skipped["count"] == len(BAD_ROWS) and [r[1] for r in skipped["first"]] == list(range(11, 11 + len(BAD_ROWS)))


# --- HF names that are not what they seem -------------------------------------------------------------


def test_hf_builder_names_without_files_are_refused_instead_of_reading_the_current_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("load_dataset was called"))
    for name in ("json", "parquet", "text"):
        with pytest.raises(UserError, match=rf"'hf:{name}' names datasets' {name} builder.*data.dataset: path/to/\*.jsonl"):
            prepare_data(DataConfig(dataset=f"hf:{name}", root=str(tmp_path)), progress=False)


def test_a_failed_load_of_a_path_names_no_hub_url(tmp_path, monkeypatch):
    def fail(*a, **k):
        raise FileNotFoundError("nothing there")

    monkeypatch.setattr(datasets, "load_dataset", fail)
    with pytest.raises(UserError) as e:
        prepare_data(DataConfig(dataset="hf:/no/such/dir", root=str(tmp_path)), progress=False)
    assert "huggingface.co" not in str(e.value) and "nothing there" in str(e.value)
    with pytest.raises(UserError, match=r"huggingface.co/datasets/someone/stories"):
        prepare_data(DataConfig(dataset="hf:someone/stories", root=str(tmp_path)), progress=False)


# --- the split and the shards -------------------------------------------------------------------------


def big_corpus(root: Path, names: list[str], per_file: int = 40) -> list[str]:
    docs = []
    for f, name in enumerate(names):
        rows = [f"file {f} row {r}: " + "some words to tokenize " * (1 + r % 4) for r in range(per_file)]
        write_jsonl(root / name, [{"text": t} for t in rows])
        docs += rows
    return docs


def test_the_val_split_stays_put_when_files_are_renamed_or_reordered(tmp_path):
    names = [f"part-{i}.jsonl" for i in range(5)]
    docs = big_corpus(tmp_path / "corpus", names)
    first = prepare_data(cfg(tmp_path / "corpus", tmp_path / "p", val_fraction=0.2), progress=False)
    _, val_before = documents(first)
    for i, name in enumerate(names):  # the last file first now, and every name new
        (tmp_path / "corpus" / name).rename(tmp_path / "corpus" / f"z-{4 - i}-renamed.jsonl")
    second = prepare_data(cfg(tmp_path / "corpus", tmp_path / "p", val_fraction=0.2), progress=False)
    train_after, val_after = documents(second)
    assert sorted(val_after) == sorted(val_before) and val_after != val_before  # same documents, another order
    assert 0.1 < len(val_after) / len(docs) < 0.3
    assert sorted(train_after + val_after) == sorted(ids_of(docs))


def test_shards_have_the_fixed_size_and_the_manifest_checksums_them(tmp_path):
    big_corpus(tmp_path / "corpus", ["a.jsonl", "b.jsonl"])
    out = prepare_data(cfg(tmp_path / "corpus", tmp_path / "p", shard_tokens=97), progress=False)
    meta = json.loads((out / "meta.json").read_text())
    for split in ("train", "val"):
        shards = meta["shards"][split]
        assert len(shards) > 1 and all(sh["tokens"] == 97 for sh in shards[:-1]) and 0 < shards[-1]["tokens"] <= 97
        for sh in shards:
            data = (out / sh["name"]).read_bytes()
            assert len(data) == 2 * sh["tokens"] and hashlib.sha256(data).hexdigest() == sh["sha256"]
        assert meta["splits"][split]["tokens"] == sum(sh["tokens"] for sh in shards)
    # windows cross shard boundaries as if the split were one file
    stream = np.array(read_split(out, "train"))
    loader = BatchLoader(out, "train", block_size=150, batch_size=16, seed=3)
    x, y = loader.get_batch(2, 1)
    for row, start in zip(x.numpy(), loader.offsets(2, 1)):
        assert (row == stream[start : start + 150]).all()


def test_a_v1_prepared_dir_still_loads(tmp_path, shakespeare_path):
    d = shutil.copytree(FIXTURES / "prepared-v1-gpt2", tmp_path / "v1")  # written by the format-v1 code
    meta = load_meta(d)
    assert meta["format_version"] == 1
    ids = ENC.encode_ordinary(shakespeare_path.read_text(encoding="utf-8")[:6000])
    n_val = int(len(ids) * 0.1)
    assert read_bins(d) == (ids[:-n_val], ids[-n_val:])
    loader = BatchLoader(d, "val", block_size=32, batch_size=4, seed=0)
    x, _ = loader.get_batch(0)
    for row, start in zip(x.numpy(), loader.offsets(0)):
        assert row.tolist() == ids[len(ids) - n_val + start : len(ids) - n_val + start + 32]
    h = hashlib.sha256((d / "train.bin").read_bytes() + b"|" + (d / "val.bin").read_bytes() + b"|").hexdigest()
    assert loader.state_dict()["tokens_sha256"] == h  # so a v1 run's checkpoint still resumes


def test_prepare_keeps_an_unchanged_v1_dir_so_its_runs_still_resume(tmp_path, shakespeare_path, capsys):
    # the fixture was prepared (by the v1 code) from this file at this path: recreate it there
    src = Path("/tmp/v1src/v1.txt")
    src.parent.mkdir(exist_ok=True)
    src.write_text(shakespeare_path.read_text(encoding="utf-8")[:6000], encoding="utf-8")
    d = shutil.copytree(FIXTURES / "prepared-v1-gpt2", tmp_path / "p" / "v1-331ec31c-gpt2")
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert prepare_data(DataConfig(dataset=str(src), root=str(tmp_path / "p")), progress=True) == d
    assert "up to date" in capsys.readouterr().err and {p.name: p.read_bytes() for p in d.iterdir()} == before
    src.write_text(src.read_text() + "an edit", encoding="utf-8")  # a changed source: rebuilt, in format 2
    prepare_data(DataConfig(dataset=str(src), root=str(tmp_path / "p")), progress=False)
    assert load_meta(d)["format_version"] == 2 and not (d / "train.bin").exists()


def test_hf_rows_that_are_not_text_are_one_line_or_skipped_when_asked(tmp_path, monkeypatch):
    ds = datasets.Dataset.from_dict({"text": [{"a": i} for i in range(4)]})
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: ds)
    with pytest.raises(UserError, match=r"row 1 of HF dataset 'x/y' split 'train' has a dict .*data.skip_bad_rows"):
        prepare_data(DataConfig(dataset="hf:x/y", root=str(tmp_path)), progress=False)
    with pytest.raises(UserError, match=r"all 4 of its rows with content were skipped as bad \(data.skip_bad_rows\), "
                       r"4 text field not text; the first, x/y, row 1: "):  # every row skipped: nothing left, and why
        prepare_data(DataConfig(dataset="hf:x/y", root=str(tmp_path), skip_bad_rows=True), progress=False)



@pytest.mark.parametrize("suffix", [".txt", ".txt.gz", ".txt.zst"])
def test_a_text_files_bom_is_no_text(tmp_path, suffix):
    """Found from outside: a UTF-8 BOM at a .txt file's start was kept as a character (a char vocabulary held
    U+FEFF, one token at each document's start), where .jsonl rows drop it. The reference: the same file without
    it, and the text's own length in characters."""
    text = "".join(DOCS[:6]).encode()
    for name, data in (("bom", b"\xef\xbb\xbf" + text), ("plain", text)):
        path = tmp_path / name / f"c{suffix}"
        path.parent.mkdir()
        if suffix.endswith(".gz"):
            path.write_bytes(gzip.compress(data))
        elif suffix.endswith(".zst"):
            write_zst(path, data)
        else:
            path.write_bytes(data)
    metas = [load_meta(prepare_data(cfg(tmp_path / n / f"c{suffix}", tmp_path / f"p{n}", tokenizer="char"),
                                    progress=False)) for n in ("bom", "plain")]
    assert "\ufeff" not in metas[0]["chars"] and metas[0]["chars"] == metas[1]["chars"]
    # (the split point may move by the BOM's 3 bytes: val_fraction is of the file's size)
    assert sum(m["splits"][s]["tokens"] for s in ("train", "val") for m in metas[:1]) == len("".join(DOCS[:6]))
