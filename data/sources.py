"""Text sources: tiny shakespeare, local files (text, JSON Lines, parquet, plain or .gz/.zst) and HF
datasets (from the hub or saved with `save_to_disk`), each streamed as pieces of documents (pieces.py).

`open_source` resolves data.dataset to a Source; the formats are read by formats.py, HF datasets by hub.py,
tiny shakespeare found (or downloaded) by download.py.
"""
from __future__ import annotations

import glob
import hashlib
import os
import re
from pathlib import Path

from errors import UserError, clipped
from fileio import path_kind

from .config import CHAT, HF_PREFIX, SHAKESPEARE, DataConfig
from .download import SHAKESPEARE_SHA256, shakespeare_path
from .formats import check_readable_kind, file_kind, files_pieces, folder_takes
from .hub import hf_source
from .pieces import Source, safe_slug


def open_source(cfg: DataConfig, spec: str | None = None, *, tail_split: bool = True,
                key: str = "data.dataset") -> Source:
    """Resolve `spec` (default cfg.dataset) to a Source, raising UserError for anything missing or
    unusable; the messages name `key`, the setting that gave `spec` (data.val_dataset for the val
    source). A single text file (tiny shakespeare too) is one document, so its val split is its tail:
    the last val_fraction of its bytes, cut where the tokens come out as for the whole text
    (`tail_split`); every other source is split by document, by the builder."""
    if key != "data.dataset":  # the checks below (and formats.py's) say data.dataset: the user wrote `key`
        try:
            return open_source(cfg, spec, tail_split=tail_split)
        except UserError as e:
            raise UserError(str(e).replace("data.dataset", key)) from None
    spec = cfg.dataset if spec is None else spec
    tail = cfg.val_fraction if tail_split else None
    if spec == SHAKESPEARE:
        if cfg.format == CHAT:
            raise UserError("data.dataset 'shakespeare' is text, not conversations; with data.format: chat name a "
                            "jsonl, json or parquet source (or hf:<name>) whose rows hold messages")
        path = shakespeare_path(cfg.local_path)
        return Source(
            slug=SHAKESPEARE,
            identity={"kind": SHAKESPEARE, "sha256": SHAKESPEARE_SHA256},
            total=path.stat().st_size,
            unit="B",
            read=lambda pos: files_pieces([path], cfg, pos, tail),
        )
    if spec.startswith(HF_PREFIX):
        name = spec[len(HF_PREFIX):]
        if _looks_local(name) and Path(name).expanduser().exists():  # hf:/path/to/dir: a local source
            return _local_source(name, cfg, tail)
        return hf_source(cfg, name)
    return _local_source(spec, cfg, tail)


_GLOB_CHARS = re.compile(r"[*?\[]")


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_dict.json").is_file()
                              or ((path / "state.json").is_file() and (path / "dataset_info.json").is_file()))


def _looks_local(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or os.sep in name.strip("/").replace("/", "", 1) or Path(name).exists()


def _local_source(spec: str, cfg: DataConfig, tail: float | None) -> Source:
    path = Path(spec).expanduser()
    if _is_saved_dataset(path):
        return hf_source(cfg, str(path), saved=True)
    if _GLOB_CHARS.search(spec) and not path.exists():  # a file or dir named with "[" is itself, not a pattern
        paths = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True) if os.path.isfile(p))
        if not paths:
            raise UserError(f"no files match data.dataset {spec!r}; check the pattern (use ** for subdirectories)")
        name = Path(_GLOB_CHARS.split(spec)[0]).name or "glob"  # the fixed part before the pattern
    elif path.is_file():
        paths, name = [path], path.name.split(".")[0] or path.stem
    elif path.is_dir():
        entries = [p for p in path.rglob("*") if folder_takes(p)]
        # a FIFO, a socket or a dangling link under a data file's name was skipped silently (named itself: refused)
        odd = next((p for p in sorted(entries) if not p.is_file() and not p.is_dir()), None)
        if odd is not None:
            raise UserError(f"data.dataset {spec!r} holds {clipped(str(odd), 200)}, which is {path_kind(odd)}, not a file; "
                            "remove it from the folder, or name the files to read with a glob")
        paths = sorted(p for p in entries if p.is_file()
                       and not (cfg.format == CHAT and file_kind(p)[0] == "text"))  # chat: its row files
        if not paths:
            raise UserError(
                f"no .txt, .jsonl, .json or .parquet files (plain, .gz or .zst) under {spec}; add some, or name other "
                f"files with a glob such as '{spec.rstrip('/')}/**/*.md'"
            )
        name = path.resolve().name
    elif os.path.lexists(path):  # a fifo, a socket, a device, a symlink loop
        raise UserError(f"data.dataset {spec!r} is {path_kind(path)}, neither a file nor a directory; give a regular "
                        "file, directory or glob")
    else:
        raise UserError(
            f"data.dataset {spec!r} does not exist; give an existing file (.txt, .jsonl, .json, .parquet, "
            f"optionally .gz/.zst), directory or glob, '{SHAKESPEARE}', or 'hf:<name>'"
        )
    for p in paths:
        check_readable_kind(p)
        if cfg.format == CHAT and file_kind(p)[0] == "text":
            raise UserError(f"{p} is a text file, not rows of conversations: data.format: chat reads .jsonl, .json "
                            f"and .parquet files (plain, .gz or .zst) whose rows hold messages; leave it out of "
                            f"data.dataset, or set data.format: text")
    # One text file is one document: its val split is its tail. Anything else is split by document.
    single_text = len(paths) == 1 and file_kind(paths[0])[0] == "text"  # plain, .gz or .zst alike
    # The files' content identifies them (hashed by fingerprint.py, which reuses a stored hash while a
    # file's size and mtime are unchanged): touching a file is no change, editing one is.
    where = hashlib.sha256(os.path.abspath(os.path.expanduser(spec)).encode()).hexdigest()[:8]
    kinds = sorted({file_kind(p)[0] for p in paths})
    identity = {"kind": "files", "field": cfg.text_field if kinds != ["text"] else None,
                "skip_bad_rows": cfg.skip_bad_rows if kinds != ["text"] else None}
    if cfg.format == CHAT:  # only when set, so every text source keeps the identity (and prepared dir) it had
        identity.update(format=CHAT, field=cfg.messages_field)
    source = Source(
        slug=f"{safe_slug(name)}-{where}",  # the hash keeps two different 'input.txt's apart
        identity=identity,
        total=sum(p.stat().st_size for p in paths),
        unit="B",
        read=lambda pos: files_pieces(paths, cfg, pos, tail if single_text else None, source),
        files=paths,
    )
    return source
