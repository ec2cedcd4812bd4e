"""The data preparation's progress bars: each moves in the unit of its total, the source files' own bytes (a
compressed file's, not the text it decompresses to, which overshot the total), and ends exactly at it."""
from __future__ import annotations

import gzip
import json
import random

import pyarrow as pa
import pytest

import data.build_writer
import data.formats
from data import DataConfig, prepare_data
from data.sources import open_source

WORDS = random.Random(0).choices(["thou", "art", "more", "lovely", "and", "temperate", "café", "🎉", "\n"], k=6000)
TEXT = " ".join(WORDS).encode()  # about 30 KB: several of the reads below, compressed or not
ROWS = b"".join(json.dumps({"text": " ".join(WORDS[i: i + 50])}).encode() + b"\n" for i in range(0, len(WORDS), 50))
NAMES = ["t.txt", "t.txt.gz", "t.txt.zst", "r.jsonl", "r.jsonl.gz", "r.jsonl.zst"]


def write(path, raw: bytes):
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(raw))
    elif path.suffix == ".zst":
        with pa.output_stream(str(path), compression="zstd") as f:
            f.write(raw)
    else:
        path.write_bytes(raw)
    return path


@pytest.mark.parametrize("name", NAMES)
def test_a_sources_advances_add_up_to_its_total_the_files_own_size(tmp_path, monkeypatch, name):
    monkeypatch.setattr(data.formats, "READ_BYTES", 997)  # many reads, so many advances
    path = write(tmp_path / name, TEXT if name.startswith("t") else ROWS)
    source = open_source(DataConfig(dataset=str(path), root=str(tmp_path / "p"), val_fraction=0.1))
    advances = [p.advance for p in source.pieces()]
    assert source.total == len(path.read_bytes()) == sum(advances), (source.total, sum(advances))
    assert min(advances) >= 0


@pytest.mark.parametrize("name", ["t.txt", "t.txt.gz", "r.jsonl.zst"])
def test_the_prepare_bars_end_at_their_totals(tmp_path, monkeypatch, name):
    bars = []
    made = data.build_writer._progress_bar

    def recorded(*args):
        bars.append(made(*args))
        return bars[-1]

    monkeypatch.setattr(data.build_writer, "_progress_bar", recorded)
    path = write(tmp_path / name, TEXT if name.startswith("t") else ROWS)
    prepare_data(DataConfig(dataset=str(path), tokenizer="char", root=str(tmp_path / "p"), val_fraction=0.1))
    size = len(path.read_bytes())
    assert [(b.desc.split()[0], b.n, b.total) for b in bars] == [("scanning", size, size), ("tokenizing", size, size)]
