"""A build's fingerprint: everything that decides the token files' content (the sources' identity, for local
files their paths and content; the tokenizer, the split, the shard size and the format), and the source files'
hashes, kept so that an unchanged file is not read again."""
from __future__ import annotations

import hashlib
from pathlib import Path

from bounded import TooLargeError, read_own
from fileio import json_loads
from ownership import MANIFEST_MAX

from .config import DataConfig
from .formats import READ_ERRORS, read_error
from .manifest import FORMAT_VERSION, json_sha256, read_meta_quietly
from .pieces import Source
from .shards import MOVE_AWAY
from .tokenizer import bpe_vocab_size

SOURCE_RECORDS = ".source-hashes.json"  # a build's source files' hashes, until its manifest holds them
SOURCE_RECORDS_MAX = MANIFEST_MAX  # bytes: the same records as the manifest's source_files


def previous_records(out: Path) -> list:
    """The [path, size, mtime_ns, sha256] records of source files that earlier prepares of `out` hashed: the
    manifest's, and an interrupted build's (SOURCE_RECORDS), so a resume does not read the corpus once more
    only to hash it (~6 s a GB here: 10% of resuming a 1 GB prepare killed halfway)."""
    records = []
    meta = read_meta_quietly(out)
    if meta and isinstance(meta.get("source_files"), list):
        records += meta["source_files"]
    try:  # bounded: one past the limit is refused in one line, not cut short (and then written over)
        interrupted = json_loads(read_own(out / SOURCE_RECORDS, "an interrupted prepare's source hashes (JSON)",
                                          limit=SOURCE_RECORDS_MAX, fix=MOVE_AWAY))
    except (OSError, ValueError, TooLargeError):  # none, unreadable, damaged or too large: hashed again (a cache)
        interrupted = None
    if isinstance(interrupted, list):
        records += interrupted
    return records


def file_hashes(files: list[Path], previous: list) -> list[list]:
    """[path, size, mtime_ns, sha256] of each file. A file whose size and mtime match a previous record keeps
    that hash (a 1 GB corpus is not re-read at every start-up); any other is read."""
    known = {tuple(r[:3]): r[3] for r in previous if isinstance(r, list) and len(r) == 4}
    out = []
    for path in files:
        try:
            st = path.stat()
            key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
            if key not in known:
                with open(path, "rb") as f:
                    known[key] = hashlib.file_digest(f, "sha256").hexdigest()
        except READ_ERRORS as e:  # the source's problem (unreadable, gone, a bad disk), not the output's
            raise read_error(path, e) from None
        out.append([*key, known[key]])
    return out


def _identity(source: Source, records: list | None) -> dict:
    identity = dict(source.identity)
    if records is not None:
        identity["files"] = [[path, sha] for path, _, _, sha in records]
    return identity


def build_fingerprint(cfg: DataConfig, source: Source, val_source: Source | None, previous: list) -> tuple[str, list | None]:
    """Everything that decides the token files' content: the sources' identity (for local files, their
    paths and CONTENT, not their mtime), tokenizer, split, shard size and format. -> (fingerprint, the
    files' records)."""
    files = None
    identities = []
    for src in (source, val_source):
        if src is None:
            continue
        records = file_hashes(src.files, previous) if src.files is not None else None
        if records is not None:
            files = (files or []) + records
        identities.append(_identity(src, records))
    settings = {
        "format_version": FORMAT_VERSION,
        "source": identities[0],
        "val_source": identities[1] if val_source is not None else None,
        "tokenizer": cfg.tokenizer,
        "val_fraction": None if val_source is not None else cfg.val_fraction,
        "shard_tokens": cfg.shard_tokens,
        "tokenizer_sample_mb": cfg.tokenizer_sample_mb if bpe_vocab_size(cfg.tokenizer) else None,
    }
    if cfg.format != "text":  # only then: a text dir's fingerprint stays what it was before data.format existed
        settings["format"] = cfg.format
    return json_sha256(settings), files


def v1_fingerprint(cfg: DataConfig, source: Source, meta: dict) -> str | None:
    """What format v1 stored as the fingerprint of these settings, `source` being cfg.dataset opened as format 1
    did (a v1 dir that matches is kept)."""
    identity = dict(source.identity)
    if identity["kind"] == "files":  # format 1 read text files only: no field, no bad rows
        identity.pop("field", None)
        identity.pop("skip_bad_rows", None)
    if source.files is not None:
        if any(p.suffix != ".txt" for p in source.files):
            return None
        identity["files"] = [[path, sha] for path, _, _, sha in file_hashes(source.files, meta)]
    return json_sha256({"format_version": 1, "source": identity, "tokenizer": cfg.tokenizer, "val_fraction": cfg.val_fraction})
