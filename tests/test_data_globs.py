"""Globs in data.dataset: glob_regex matches what glob.glob matches (the reference), and a glob that would read the
files a prepare writes into data.root is refused before the first prepare writes them."""
from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from data import DataConfig, prepare_data
from errors import UserError

DOCS = [f"Document number {i}: plain words here, and a few more of them." for i in range(6)]


def cfg(dataset, root: Path, **kw) -> DataConfig:
    return DataConfig(dataset=str(dataset), root=str(root), val_fraction=0.3, **kw)


TREE = ["a.txt", "b.json", "d/c.json", "d/e/f.jsonl", "d/e/.h.json", ".x/y.json", "d/e/g/h.txt", "meta.json",
        "p/q/meta.json"]


@pytest.mark.parametrize("pattern", ["*.json", "**/*.json", "**/*.json*", "d/*/*.jsonl", "d/**", "**", "*/*.json",
                                     "d/e/[fg]*", "d/e/[!f]*", "?.txt", "**/meta.json", "d/**/*.txt", "[.]x/*"])
def test_glob_regex_matches_what_glob_matches(tmp_path, pattern):
    """The reference: glob.glob (recursive) over a tree with nested and hidden files."""
    from data.build import glob_regex

    for p in TREE:
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).touch()
    full = str(tmp_path / pattern)
    expected = {p for p in glob.glob(full, recursive=True) if Path(p).is_file()}
    assert {str(tmp_path / p) for p in TREE if glob_regex(full).fullmatch(str(tmp_path / p))} == expected


@pytest.mark.parametrize("pattern, refused", [("**/*.json*", True), ("*/*/*.json*", True), ("*.jsonl", False),
                                              ("*/*.jsonl", False)])
def test_a_glob_that_would_read_data_roots_files_is_refused_on_the_first_prepare(tmp_path, pattern, refused):
    """Found from outside: `g/**/*.json*` with data.root g/prepared passed the first prepare (nothing matched
    yet) and refused every later one, the run's rerun and resume included. Now refused before anything is
    written; a pattern that cannot reach the prepared files is not."""
    folder = tmp_path / "g" / "/".join(["sub"] * pattern.count("*/"))  # where the pattern finds the data
    folder.mkdir(parents=True)
    for i, d in enumerate(DOCS[:6]):
        (folder / f"c{i}.jsonl").write_text(json.dumps({"text": d}) + "\n")
    c = cfg(tmp_path / "g" / pattern, tmp_path / "g" / "prepared", tokenizer="char")
    if refused:
        with pytest.raises(UserError, match="would match .*meta.json, which this prepare writes") as e:
            prepare_data(c, progress=False)
        assert "\n" not in str(e.value) and not (tmp_path / "g" / "prepared").exists()
    else:
        prepare_data(c, progress=False)
        prepare_data(c, progress=False)  # and again: up to date, not refused
