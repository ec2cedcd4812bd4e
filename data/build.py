"""Build a prepared directory (token shards and meta.json) from a source, check it, and read its metadata.

Format (version 2; see data/README.md):
- `<split>-<build>-<n>.bin`: each split's token stream (documents joined by the tokenizer's eot, none
  before the first or after the last; empty documents skipped) as flat little-endian uint16 (vocab <=
  65536) or uint32, cut into shards of exactly `shard_tokens` tokens (the last one shorter). `<build>`
  is the start of the fingerprint, so a rebuild writes beside the data it replaces.
- The val split: the documents whose hash falls under val_fraction (shards.doc_in_val), so it does not
  depend on file names or order; of a single text file (one document), its tail (the last val_fraction
  of its bytes, from the first place after that where the tokens come out as for the whole text); with
  data.val_dataset, that source.
- `meta.json`, the manifest: see `_manifest` below. It is written last and replaced atomically: a
  prepare that fails or is killed leaves the previous data as it was, and a killed one resumes
  (shards.py). `bytes` per split is the UTF-8 size of the text its tokens stand for, for bits-per-byte.

Format version 1 (train.bin, val.bin, the last val_fraction of the tokens as val) still loads.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from errors import UserError, short_error, write_fix
from fileio import (DirLock, atomic_write_bytes, check_writable_dir, fsync_dir, pid_alive, process_start_time,
                    remove_stale_temps)

from .shards import (INLINE_BELOW, SPLITS, doc_in_val, file_sha256, load_resume_state, peak_memory_mb,
                     sample_sha256, write_shards)
from .config import DataConfig
from .sources import READ_ERRORS, Piece, Source, open_source, read_error
from .tokenizer import CHAR, CharTokenizer, Tokenizer, bpe_vocab_size, get_tokenizer, train_bpe

FORMAT_VERSION = 2
READS = (1, 2)  # format versions load_meta reads
META_NAME = "meta.json"
PREPARE_LOCK = ".prepare.lock"
READERS = ".readers"  # one file per live process reading the dir (hold_data)
SOURCE_RECORDS = ".source-hashes.json"  # a build's source files' hashes, until its manifest holds them
SOURCE_RECORDS_MAX = 64 << 20  # read at most this much of it
VERIFY_ALL = 1 << 30  # up to this many bytes of tokens, a start-up check hashes them all; above, samples
DEFAULT_VAL_FRACTION = DataConfig.val_fraction
# prepare rebuilds any dir it finds unusable, so this is the fix for every broken-data error
REBUILD = "re-run `python -m data.prepare` with the same settings to rebuild it"


def prepare_data(cfg: DataConfig, *, progress: bool = True) -> Path:
    """Make sure the prepared dir for `cfg` exists, is current and undamaged; return its path.

    Skips the work when the stored fingerprint matches and the tokens check out, rebuilds (saying why)
    when they don't, resumes a prepare that was killed, and refuses to rebuild a dir a live training
    run reads (hold_data).
    """
    cfg.validate()
    check_writable_dir(cfg.root, "data.root")
    main_source, val_source = _open_sources(cfg)
    out = Path(cfg.root) / dir_name(cfg, main_source, val_source)
    _check_is_dir(out)
    fingerprint, files = _fingerprint(cfg, main_source, val_source, _previous_records(out))
    reason = _rebuild_reason(out, cfg, fingerprint)
    if reason is None:
        if progress:
            _say(f"{out} is up to date")
        return out
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    lock = _wait_for(DirLock(out, PREPARE_LOCK), out)
    try:
        reason = _rebuild_reason(out, cfg, fingerprint)  # another process may just have built it
        if reason is None:
            return out
        _check_in_the_way(out, fingerprint[:12])
        if reason and (reader := live_readers(out)):
            raise UserError(f"refusing to rebuild {out} ({reason}): it is read by {reader['what']} (pid {reader['pid']}); "
                            f"stop that run first, or prepare into another data.root")
        for stale in remove_stale_temps(out):
            _say(f"removed {stale}, left by a prepare that was killed")
        if reason:
            _say(f"rebuilding {out}: {reason}")
        _build(out, cfg, main_source, val_source, fingerprint, files, progress)
    finally:
        lock.release()
        if created and out.is_dir() and not any(out.iterdir()):
            shutil.rmtree(out, ignore_errors=True)  # a failed first build leaves no empty dir behind
    if progress:
        _say(f"prepared {out}")
    return out


def _check_is_dir(out: Path) -> None:
    """The prepared dir's name taken by a file (or a link to nowhere): mkdir would fail with a traceback,
    and the file may be someone's; it is not ours to remove."""
    if (out.exists() or out.is_symlink()) and not out.is_dir():
        raise UserError(f"{out} is a file, not a directory: the prepared data goes there; move it away, or set "
                        f"data.root to another directory")


def _check_in_the_way(out: Path, build: str) -> None:
    """Before a build: every name it writes a file to must be free or a file (os.replace fails on a folder
    halfway through the build), and READERS a folder (hold_data). What is there is not ours to remove."""
    for p in [*out.glob(f"*{build}*"), out / SOURCE_RECORDS]:
        if p.exists() and not p.is_file():
            raise UserError(f"{p} is a directory (or other non-file) where the prepared data writes a file; move it "
                            f"away (or set data.root to another directory), then rerun")
    _check_readers_dir(out)


def _check_readers_dir(out: Path) -> None:
    if (out / READERS).exists() and not (out / READERS).is_dir():
        raise UserError(f"{out / READERS} is a file where the prepared data keeps a directory (of the runs reading it); "
                        f"move it away (or set data.root to another directory), then rerun")


def dir_name(cfg: DataConfig, source: Source, val_source: Source | None) -> str:
    """The prepared dir's name: source, tokenizer, and the split when it is not the default, so two
    splits of one source are two dirs (a prepare with another val_fraction never rebuilds the dir a
    run is reading)."""
    name = f"{source.slug}-{cfg.tokenizer.replace(':', '')}"
    if val_source is not None:
        return f"{name}-val-{val_source.slug}"
    if cfg.val_fraction != DEFAULT_VAL_FRACTION:
        return f"{name}-val{cfg.val_fraction:g}"
    return name


def load_meta(data_dir: str | os.PathLike, tokenizer: str | None = None) -> dict:
    """Read and check `data_dir/meta.json` and the token files' sizes; with `tokenizer`, also that it
    matches. A trained BPE's tokenizer.json comes back as meta["bpe"]."""
    data_dir = Path(data_dir)
    path = data_dir / META_NAME
    meta = _read_meta_json(data_dir)
    if meta is None:
        raise UserError(
            f"no prepared data in {data_dir} ({META_NAME} missing); run `python -m data.prepare --dataset ... "
            f"--root {data_dir.parent}` first (train.py does it for you)"
        )
    version = meta.get("format_version")
    if version not in READS:
        raise UserError(f"{path} has format_version {version!r}, this code reads {' and '.join(map(str, READS))}; {REBUILD}")
    try:
        ok = (
            isinstance(meta["tokenizer"], str)
            and isinstance(meta["vocab_size"], int)
            and isinstance(meta["eot"], int)
            and meta["dtype"] in ("uint16", "uint32")
            and (meta["chars"] is None or isinstance(meta["chars"], str))
            and isinstance(meta["fingerprint"], str)
            and isinstance(meta["tokens_sha256"], str)
            and all(isinstance(meta["splits"][s][k], int) for s in SPLITS for k in ("tokens", "bytes"))
        )
        if version == 2:
            ok = ok and all(
                isinstance(sh["name"], str) and "/" not in sh["name"] and isinstance(sh["tokens"], int)
                and sh["tokens"] > 0 and isinstance(sh["sha256"], str) and isinstance(sh["sample_sha256"], str)
                for s in SPLITS for sh in meta["shards"][s]
            ) and (meta.get("tokenizer_file") is None or isinstance(meta["tokenizer_file"], str))
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise UserError(f"{path} is missing fields or has wrong types (or was written by an older version); {REBUILD}")
    for split in SPLITS:
        info = meta["splits"][split]
        if info["tokens"] > 0 and info["bytes"] <= 0:  # bits per byte would divide by zero
            raise UserError(f"{path} says the {split} split's {info['tokens']} tokens stand for {info['bytes']} bytes of "
                            f"text; {REBUILD}")
    if meta["tokenizer"] == CHAR:
        chars = meta["chars"]
        if not chars or meta["vocab_size"] != len(chars) + 1 or meta["eot"] != len(chars) \
                or "".join(sorted(set(chars))) != chars:
            raise UserError(f"{path}'s char vocabulary does not match its vocab_size {meta['vocab_size']} and eot "
                            f"{meta['eot']} (a vocabulary of n characters has vocab_size n + 1, eot n); {REBUILD}")
    if tokenizer is not None and meta["tokenizer"] != tokenizer:
        raise UserError(
            f"{data_dir} was prepared with tokenizer {meta['tokenizer']!r}, but {tokenizer!r} was asked for; "
            f"set data.tokenizer to {meta['tokenizer']!r}, or prepare the data with {tokenizer!r} (another dir)"
        )
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in SPLITS:
        files = shard_files(data_dir, meta, split)
        total = 0
        for bin_path, tokens in files:
            if not bin_path.is_file():
                problem = "is not a file" if bin_path.exists() else "is missing"
                raise UserError(f"{bin_path} {problem}; {REBUILD}")
            size = bin_path.stat().st_size
            if size % itemsize:
                raise UserError(
                    f"{bin_path} is corrupt: {size} bytes is not a multiple of {itemsize} ({meta['dtype']}); {REBUILD}"
                )
            if tokens is not None and size // itemsize != tokens:
                raise UserError(f"{bin_path} holds {size // itemsize} tokens but {META_NAME} says {tokens}; {REBUILD}")
            total += size // itemsize
        if total != meta["splits"][split]["tokens"]:
            raise UserError(f"the {split} split in {data_dir} holds {total} tokens but {META_NAME} says "
                            f"{meta['splits'][split]['tokens']}; {REBUILD}")
    meta["bpe"] = None
    if bpe_vocab_size(meta["tokenizer"]) is not None:
        tok_path = data_dir / str(meta.get("tokenizer_file"))
        try:
            meta["bpe"] = tok_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise UserError(f"{tok_path}, the trained tokenizer, is missing or unreadable; {REBUILD}") from None
        if hashlib.sha256(meta["bpe"].encode()).hexdigest() != meta.get("tokenizer_sha256"):
            raise UserError(f"{tok_path} is not the tokenizer these tokens were made with (its sha256 differs); {REBUILD}")
    return meta


def shard_files(data_dir: Path, meta: dict, split: str) -> list[tuple[Path, int | None]]:
    """(path, tokens) of each token file of a split, in stream order (tokens None: v1, see the file)."""
    if meta["format_version"] == 1:
        return [(data_dir / f"{split}.bin", None)]
    return [(data_dir / sh["name"], sh["tokens"]) for sh in meta["shards"][split]]


def verify_tokens(data_dir: Path, meta: dict) -> str | None:
    """Check the token files' content against the manifest: every byte hashed when the split files
    total up to VERIFY_ALL (1 GiB), else each shard's sampled hash (64 blocks of 64 KiB), which finds a
    damaged region but not every single changed byte. None if they check out, else what is wrong.
    Format v1 has one hash over both splits: checked in full up to VERIFY_ALL, not at all above."""
    files = [f for s in SPLITS for f, _ in shard_files(data_dir, meta, s)]
    total = sum(f.stat().st_size for f in files)
    if meta["format_version"] == 1:
        if total > VERIFY_ALL:
            return None
        h = hashlib.sha256()
        for f in files:
            with open(f, "rb") as fh:
                while chunk := fh.read(16 << 20):
                    h.update(chunk)
            h.update(b"|")
        return None if h.hexdigest() == meta["tokens_sha256"] else "the token files' content differs from their checksum"
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in SPLITS:
        for sh in meta["shards"][split]:
            path = data_dir / sh["name"]
            if total <= VERIFY_ALL:
                if file_sha256(path) != sh["sha256"]:
                    return f"{sh['name']}'s content differs from its checksum"
            elif sample_sha256(path, itemsize) != sh["sample_sha256"]:
                return f"{sh['name']}'s content differs from its sampled checksum"
    return None


# --- who reads a prepared dir ---------------------------------------------------------------------


def hold_data(data_dir: str | os.PathLike, what: str) -> Callable[[], None]:
    """Register this process as a reader of `data_dir` (a training run): prepare refuses to rebuild it
    while the process lives. Returns the function that unregisters it."""
    data_dir = Path(data_dir)
    _check_readers_dir(data_dir)
    lock = _wait_for(DirLock(data_dir, PREPARE_LOCK), data_dir)  # not while a prepare is rebuilding it
    try:
        (data_dir / READERS).mkdir(exist_ok=True)
        me = data_dir / READERS / f"{socket.gethostname()}-{os.getpid()}.json"
        atomic_write_bytes(me, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "what": what,
                                           "started": process_start_time(os.getpid())}).encode())
    finally:
        lock.release()
    return lambda: me.unlink(missing_ok=True)


def live_readers(data_dir: Path) -> dict | None:
    """The first live reader of `data_dir` ({"pid", "host", "what"}), removing the records of dead ones."""
    for path in sorted((data_dir / READERS).glob("*.json")):
        try:
            info = json.loads(path.read_text())
            pid, host = int(info["pid"]), info["host"]
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if host != socket.gethostname() or pid_alive(pid, info.get("started")):
            return info
        path.unlink(missing_ok=True)
    return None


# --- internals ------------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _open_sources(cfg: DataConfig) -> tuple[Source, Source | None]:
    if not cfg.val_dataset:
        return open_source(cfg), None
    return open_source(cfg, tail_split=False), open_source(cfg, cfg.val_dataset, tail_split=False)


def _read_meta_json(data_dir: Path) -> dict | None:
    path = data_dir / META_NAME
    if path.exists() and not path.is_file():  # a folder (or a device): "free some space" would be wrong advice
        raise UserError(f"{path} is not a file; move it away (the prepared data's metadata goes there), then rerun")
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, IsADirectoryError):
        raise UserError(f"{path} is not valid JSON; {REBUILD}") from None
    if not isinstance(meta, dict):
        raise UserError(f"{path} is not a JSON object; {REBUILD}")
    return meta


def _wait_for(lock: DirLock, out: Path) -> DirLock:
    """Take `out`'s prepare lock, waiting while another live process prepares the same directory."""
    said = False
    while (holder := lock.try_acquire()) is not None:
        if holder.get("host") != socket.gethostname():
            raise UserError(f"{out} is being prepared by pid {holder.get('pid')} on host {holder.get('host')} (since "
                            f"{holder.get('since')}); wait for it, or delete {lock.path} if that process is gone")
        if not said:
            _say(f"waiting for pid {holder.get('pid')}, which is preparing {out}")
            said = True
        time.sleep(0.5)
    return lock


def _read_meta_quietly(out: Path) -> dict | None:
    try:
        return _read_meta_json(out)
    except UserError:
        return None


def _previous_records(out: Path) -> list:
    """The [path, size, mtime_ns, sha256] records of source files that earlier prepares of `out` hashed: the
    manifest's, and an interrupted build's (SOURCE_RECORDS), so a resume does not read the corpus once more
    only to hash it (~6 s a GB here: 10% of resuming a 1 GB prepare killed halfway)."""
    records = []
    meta = _read_meta_quietly(out)
    if meta and isinstance(meta.get("source_files"), list):
        records += meta["source_files"]
    try:
        with open(out / SOURCE_RECORDS, "rb") as f:
            interrupted = json.loads(f.read(SOURCE_RECORDS_MAX))
    except (OSError, ValueError):  # none, unreadable or cut short: those files are hashed again
        interrupted = None
    if isinstance(interrupted, list):
        records += interrupted
    return records


def _file_hashes(files: list[Path], previous: list) -> list[list]:
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


def _fingerprint(cfg: DataConfig, source: Source, val_source: Source | None, previous: list) -> tuple[str, list | None]:
    """Everything that decides the token files' content: the sources' identity (for local files, their
    paths and CONTENT, not their mtime), tokenizer, split, shard size and format. -> (fingerprint, the
    files' records)."""
    files = None
    identities = []
    for src in (source, val_source):
        if src is None:
            continue
        records = _file_hashes(src.files, previous) if src.files is not None else None
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
    return _hash(settings), files


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _v1_fingerprint(cfg: DataConfig, meta: dict) -> str | None:
    """What format v1 stored as the fingerprint of these settings (a v1 dir that matches is kept)."""
    if cfg.val_dataset or meta.get("format_version") != 1:
        return None
    try:
        source = open_source(cfg)
    except UserError:
        return None
    identity = dict(source.identity)
    if identity["kind"] == "files":  # format 1 read text files only: no field, no bad rows
        identity.pop("field", None)
        identity.pop("skip_bad_rows", None)
    if source.files is not None:
        if any(p.suffix != ".txt" for p in source.files):
            return None
        identity["files"] = [[path, sha] for path, _, _, sha in _file_hashes(source.files, meta)]
    return _hash({"format_version": 1, "source": identity, "tokenizer": cfg.tokenizer, "val_fraction": cfg.val_fraction})


def _rebuild_reason(out: Path, cfg: DataConfig, fingerprint: str) -> str | None:
    """None if `out` is current and its tokens check out, "" if it's new, else why it must be rebuilt.

    Raises instead when `out` holds another tokenizer's data: that dir was renamed or copied by hand,
    and overwriting it would destroy data that is good, just misplaced.
    """
    if (out / META_NAME).exists() and not (out / META_NAME).is_file():  # rebuilding can't fix that: say so
        _read_meta_json(out)
    # The part of a UserError before ";" names the problem; its fix ("re-run prepare") is what we're doing.
    try:
        raw = _read_meta_json(out)
    except UserError as e:
        return str(e).split(";")[0]
    if raw is None:
        left = [p for p in out.iterdir() if p.name not in (PREPARE_LOCK, READERS)] if out.is_dir() else []
        if any(p.name.startswith(".prepare-") for p in left):
            return ""  # a killed prepare's record: the build says it resumes
        return f"{META_NAME} is missing" if any(not p.name.startswith(".") for p in left) else ""
    if isinstance(raw.get("tokenizer"), str) and raw["tokenizer"] != cfg.tokenizer:
        raise UserError(
            f"{out} holds data prepared with tokenizer {raw['tokenizer']!r}, not {cfg.tokenizer!r}; move it away "
            f"(or use another data.root) and prepare again"
        )
    try:
        meta = load_meta(out)
    except UserError as e:
        return str(e).split(";")[0]
    if meta["fingerprint"] != fingerprint and meta["fingerprint"] != _v1_fingerprint(cfg, meta):
        return "the source or the split settings changed since it was prepared"
    return verify_tokens(out, meta)


def _chained(source: Source, val_source: Source | None, pos: Any) -> Iterator[Piece]:
    """Both sources' pieces as one stream, positions [source index, *the source's position]."""
    start = pos[0] if pos is not None else 0
    for index, src in enumerate((source, val_source)):
        if src is None or index < start:
            continue
        inner = pos[1:] if pos is not None and index == start else None
        forced = None if val_source is None else index
        for p in src.read(inner):
            yield Piece(p.new_doc, p.text, p.advance, [index, *p.pos] if p.pos is not None else None,
                        forced if forced is not None else p.split)


def _progress_bar(total: int | None, unit: str, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, unit_scale=True, desc=desc, disable=not enabled, file=sys.stderr,
                mininterval=0.5)


def _char_vocab(source: Source, val_source: Source | None, progress: bool) -> str:
    """First pass for the char tokenizer: every character of the sources (both splits), sorted."""
    seen: set[str] = set()
    with _progress_bar(source.total, source.unit, "scanning characters", progress) as bar:
        for piece in _chained(source, val_source, None):
            seen.update(piece.text)
            bar.update(piece.advance)
    return "".join(sorted(seen))


def _bpe_sample(source: Source, val_source: Source | None, cfg: DataConfig) -> Iterator[str]:
    """The text the BPE is trained on: about tokenizer_sample_mb of the train documents, whole documents
    chosen by a hash (so spread over the corpus, not its first files), in pieces."""
    budget = cfg.tokenizer_sample_mb << 20
    rate = min(1.0, budget / source.total) if source.unit == "B" and source.total else 1.0
    taken, keep = 0, False
    for piece in source.read(None):
        if piece.new_doc:
            if taken >= budget:
                return
            in_val = val_source is None and piece.split is None and doc_in_val(piece.text, cfg.val_fraction)
            # a second hash (of the reversed text) picks the sample, independently of the split's
            keep = not in_val and (rate >= 1.0 or doc_in_val(piece.text[::-1], rate))
        if keep and piece.split != 1:  # never the val tail of a single text file
            taken += len(piece.text)
            yield piece.text


def _tokenizer_for(out: Path, build: str, cfg: DataConfig, source: Source, val_source: Source | None,
                   resume: dict | None, progress: bool) -> tuple[Tokenizer, dict]:
    """The tokenizer and what the manifest records of it ({"chars"} / {"tokenizer_file", ...})."""
    if cfg.tokenizer == CHAR:
        chars = resume["chars"] if resume else _char_vocab(source, val_source, progress)
        if not chars:
            raise _empty(cfg)
        return CharTokenizer(chars), {"chars": chars}
    vocab = bpe_vocab_size(cfg.tokenizer)
    if vocab is None:
        return get_tokenizer(cfg.tokenizer), {}
    path = out / f"tokenizer-{build}.json"
    if resume and path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == resume.get("tokenizer_sha256"):
        text = path.read_text(encoding="utf-8")
    else:
        if progress:
            _say(f"training the {cfg.tokenizer} tokenizer on up to {cfg.tokenizer_sample_mb} MB of the corpus")
        text = train_bpe(_bpe_sample(source, val_source, cfg), vocab)
        atomic_write_bytes(path, text.encode("utf-8"))
    tok = get_tokenizer(cfg.tokenizer, bpe=text)
    return tok, {"tokenizer_file": path.name, "tokenizer_sha256": hashlib.sha256(text.encode()).hexdigest()}


def _workers(cfg: DataConfig, source: Source, val_source: Source | None) -> int:
    n = cfg.num_proc
    if not n:
        try:
            n = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            n = os.cpu_count() or 1
    total = sum(s.total or 0 for s in (source, val_source) if s is not None)
    if all(s.unit == "B" and s.total is not None for s in (source, val_source) if s is not None) \
            and total < INLINE_BELOW and not cfg.num_proc:
        return 1  # a small source: starting processes would cost more than they save
    return n


def _build(out: Path, cfg: DataConfig, source: Source, val_source: Source | None, fingerprint: str,
           files: list | None, progress: bool) -> None:
    build = fingerprint[:12]
    try:
        _write_build(out, build, cfg, source, val_source, fingerprint, files, progress)
    except OSError as e:  # a full disk, a read-only filesystem, ...: the old data (if any) is as it was
        _remove_build(out, build)
        raise UserError(f"cannot write prepared data in {out} ({short_error(e)}); "
                        f"{write_fix(e, 'set data.root to another disk')} (the previous data, if any, is kept)") from None
    except UserError:
        _remove_build(out, build)  # bad input: the files of this build are of no use for a resume
        raise
    # anything else (Ctrl-C, SIGTERM, a kill) keeps this build's finished shards: the next prepare resumes


def _remove_build(out: Path, build: str) -> None:
    for p in [*out.glob(f"*{build}*"), out / SOURCE_RECORDS]:
        if p.name != META_NAME and not p.is_dir():  # a folder is not one of ours (_check_in_the_way)
            p.unlink(missing_ok=True)


def _write_build(out: Path, build: str, cfg: DataConfig, source: Source, val_source: Source | None,
                 fingerprint: str, files: list | None, progress: bool) -> None:
    dtype_of = lambda tok: np.dtype(np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32)  # noqa: E731
    resume = load_resume_state(out, build, fingerprint, _say)
    if files:  # removed with the other build files once the manifest (which holds them too) is written
        atomic_write_bytes(out / SOURCE_RECORDS, json.dumps(files).encode())
    tok, tok_record = _tokenizer_for(out, build, cfg, source, val_source, resume, progress)
    dtype = dtype_of(tok)
    skipped = list(resume.get("skipped", [])) if resume else []
    for src in (source, val_source):
        if src is not None:
            src.skipped.clear()
    if resume:
        done = sum(len(resume["splits"][s]["shards"]) for s in SPLITS)
        _say(f"resuming the interrupted prepare of {out}: {done} finished shard(s) kept")

    def skipped_now() -> list:
        return skipped + [row for src in (source, val_source) if src is not None for row in src.skipped]

    def extra_state() -> dict:
        return {"dtype": dtype.name, "chars": tok.chars, "skipped": skipped_now()[:1000],
                "skipped_count": len(skipped_now()), "tokenizer_sha256": tok_record.get("tokenizer_sha256")}

    totals = [s.total for s in (source, val_source) if s is not None]
    total = sum(totals) if all(t is not None for t in totals) and len({s.unit for s in (source, val_source) if s}) == 1 else None
    workers = _workers(cfg, source, val_source)
    with _progress_bar(total, source.unit, f"tokenizing ({tok.name}, {workers} process{'es' if workers > 1 else ''})",
                       progress) as bar:
        result = write_shards(
            out, build, fingerprint, _chained(source, val_source, resume["pos"] if resume else None), tok,
            shard_tokens=cfg.shard_tokens, val_fraction=cfg.val_fraction, workers=workers, resume=resume,
            extra_state=extra_state, bar=bar, say=_say)
    n_tokens = sum(result[s]["tokens"] for s in SPLITS)
    if n_tokens == 0:
        raise _empty(cfg)
    for split in SPLITS:
        if result[split]["tokens"] == 0:
            raise _one_split_empty(cfg, split, sum(result[s]["docs"] for s in SPLITS), n_tokens)
    skipped_rows = skipped_now()
    if skipped_rows:
        first = skipped_rows[0]
        _say(f"skipped {len(skipped_rows)} bad row(s) (data.skip_bad_rows); the first: {first[0]}, row {first[1]}: {first[2]}")
    meta = _manifest(cfg, tok, dtype, fingerprint, files, result, tok_record, skipped_rows)
    # Everything new is complete and synced: switch the manifest over, then remove the old data.
    atomic_write_bytes(out / META_NAME, (json.dumps(meta, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    keep = {sh["name"] for s in SPLITS for sh in meta["shards"][s]} | {META_NAME, PREPARE_LOCK, READERS}
    keep |= {meta["tokenizer_file"]} if meta.get("tokenizer_file") else set()
    for p in out.iterdir():
        if p.name not in keep and p.is_file() and not p.name.endswith(".tmp"):
            p.unlink(missing_ok=True)  # the previous build's files, this build's resume record and partials
    fsync_dir(out)
    if progress:
        main_mb, child_mb = peak_memory_mb()
        _say(f"peak memory: {main_mb:.0f} MB in this process" + (f", {child_mb:.0f} MB in the largest tokenizer process"
                                                                   if workers > 1 else ""))


def _manifest(cfg: DataConfig, tok: Tokenizer, dtype: np.dtype, fingerprint: str, files: list | None, result: dict,
              tok_record: dict, skipped: list) -> dict:
    shard_lists = {s: result[s]["shards"] for s in SPLITS}
    return {
        # the tokens themselves, through the shards' checksums: what a resumed run checks it trains on
        "tokens_sha256": _hash([[sh["sha256"] for sh in shard_lists[s]] for s in SPLITS]),
        "format_version": FORMAT_VERSION,
        "source": cfg.dataset,
        "val_dataset": cfg.val_dataset or None,
        "tokenizer": tok.name,
        "vocab_size": tok.vocab_size,
        "eot": tok.eot,
        "dtype": dtype.name,
        "chars": tok.chars,
        **{k: v for k, v in tok_record.items() if k != "chars"},
        "tokenizer_fingerprint": _hash([tok.name, tok.vocab_size, tok.chars, tok_record.get("tokenizer_sha256")]),
        "fingerprint": fingerprint,
        "source_files": files,
        "val_fraction": cfg.val_fraction if not cfg.val_dataset else None,
        "shard_tokens": cfg.shard_tokens,
        "documents": sum(result[s]["docs"] for s in SPLITS),
        "skipped_rows": {"count": len(skipped), "first": skipped[:20]},
        "splits": {s: {"tokens": result[s]["tokens"], "bytes": result[s]["bytes"], "documents": result[s]["docs"]}
                   for s in SPLITS},
        "shards": shard_lists,
    }


def _empty(cfg: DataConfig) -> UserError:
    return UserError(f"data.dataset {cfg.dataset!r} contains no text; point it at non-empty text")


def _one_split_empty(cfg: DataConfig, split: str, docs: int, tokens: int) -> UserError:
    if cfg.val_dataset:
        which = "data.val_dataset" if split == "val" else "data.dataset"
        return UserError(f"{which} {getattr(cfg, which.split('.')[1])!r} contains no text; point it at non-empty text")
    return UserError(
        f"data.dataset {cfg.dataset!r} has {docs} document(s) ({tokens} tokens) and none fell into the {split} "
        f"split (val holds the documents whose hash falls under val_fraction {cfg.val_fraction}); use more "
        f"documents or another val_fraction, or name a val source with data.val_dataset"
    )
