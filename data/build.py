"""Build a prepared directory (train.bin, val.bin, meta.json) from a source, and read its metadata.

Format (version 1):
- `train.bin`, `val.bin`: the token stream as flat little-endian uint16 (vocab <= 65536) or uint32.
  Documents are joined with the tokenizer's eot id between them (none before the first or after
  the last; empty documents are skipped). The val split is the last `int(N * val_fraction)` tokens
  of the stream of N tokens, the train split everything before it. For a multi-document source that
  means the last documents; shuffle a sorted corpus beforehand if that would bias validation.
- `meta.json`: see `_meta` below. `bytes` per split is the UTF-8 size of the text its tokens stand
  for (eot counts 0), for bits-per-byte.

Rebuilding writes every new file to a temp name first and swaps them in only once all are complete,
so a failing prepare leaves good data as it was.
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
from typing import Iterator

import numpy as np

from errors import UserError, short_error
from fileio import DirLock, check_writable_dir, fsync_dir, remove_stale_temps, temp_path, write_synced

from .config import DataConfig
from .sources import Source, open_source
from .tokenizer import CHAR, CharTokenizer, Tokenizer, get_tokenizer

FORMAT_VERSION = 1
META_NAME = "meta.json"
SPLITS = ("train", "val")
BATCH_CHARS = 8 << 20  # text tokenized per thread-pool call; bounds memory along with CHUNK_CHARS
COPY_TOKENS = 4 << 20  # tokens moved per read when splitting off the val tail
# prepare rebuilds any dir it finds unusable, so this is the fix for every broken-data error
REBUILD = "re-run `python -m data.prepare` with the same settings to rebuild it"


def prepare_data(cfg: DataConfig, *, progress: bool = True) -> Path:
    """Make sure the prepared dir for `cfg` exists and is current; return its path.

    Skips the work when the stored fingerprint matches, rebuilds (saying why) when it doesn't.
    """
    cfg.validate()
    check_writable_dir(cfg.root, "data.root")
    source = open_source(cfg)
    out = Path(cfg.root) / f"{source.slug}-{cfg.tokenizer}"
    fingerprint, files = _fingerprint(cfg, source, _read_meta_quietly(out))
    reason = _rebuild_reason(out, cfg.tokenizer, fingerprint)
    if reason is None:
        if progress:
            _say(f"{out} is up to date")
        return out
    out.mkdir(parents=True, exist_ok=True)
    lock = _wait_for(DirLock(out, ".prepare.lock"), out)
    try:
        reason = _rebuild_reason(out, cfg.tokenizer, fingerprint)  # another process may just have built it
        if reason is None:
            return out
        for stale in remove_stale_temps(out):
            _say(f"removed {stale}, left by a prepare that was killed")
        if reason:
            _say(f"rebuilding {out}: {reason}")
        _build(out, cfg, source, fingerprint, files, progress)
    finally:
        lock.release()
    if progress:
        _say(f"prepared {out}")
    return out


def load_meta(data_dir: str | os.PathLike, tokenizer: str | None = None) -> dict:
    """Read and check `data_dir/meta.json` and the bins' sizes; with `tokenizer`, also that it matches."""
    data_dir = Path(data_dir)
    path = data_dir / META_NAME
    meta = _read_meta_json(data_dir)
    if meta is None:
        raise UserError(
            f"no prepared data in {data_dir} ({META_NAME} missing); run `python -m data.prepare --dataset ... "
            f"--root {data_dir.parent}` first (train.py does it for you)"
        )
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserError(
            f"{path} has format_version {meta.get('format_version')!r}, this code reads {FORMAT_VERSION}; {REBUILD}"
        )
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
        bin_path = data_dir / f"{split}.bin"
        if not bin_path.is_file():
            raise UserError(f"{bin_path} is missing; {REBUILD}")
        size = bin_path.stat().st_size
        if size % itemsize:
            raise UserError(
                f"{bin_path} is corrupt: {size} bytes is not a multiple of {itemsize} ({meta['dtype']}); {REBUILD}"
            )
        if size // itemsize != meta["splits"][split]["tokens"]:
            raise UserError(
                f"{bin_path} holds {size // itemsize} tokens but {META_NAME} says {meta['splits'][split]['tokens']}; "
                f"{REBUILD}"
            )
    return meta


# --- internals ------------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _read_meta_json(data_dir: Path) -> dict | None:
    path = data_dir / META_NAME
    if path.exists() and not path.is_file():  # a folder (or a device): "free some space" would be wrong advice
        raise UserError(f"{path} is not a file; move it away (the prepared data's metadata goes there), then rerun")
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
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


def _file_hashes(files: list[Path], previous: dict | None) -> list[list]:
    """[path, size, mtime_ns, sha256] of each file. A file whose size and mtime match the previous
    prepare's record keeps that hash (a 1 GB corpus is not re-read at every start-up); any other is read."""
    known = {}
    if previous and isinstance(previous.get("source_files"), list):
        known = {tuple(r[:3]): r[3] for r in previous["source_files"] if isinstance(r, list) and len(r) == 4}
    out = []
    for path in files:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key not in known:
            with open(path, "rb") as f:
                known[key] = hashlib.file_digest(f, "sha256").hexdigest()
        out.append([*key, known[key]])
    return out


def _fingerprint(cfg: DataConfig, source: Source, previous: dict | None) -> tuple[str, list | None]:
    """Everything that decides the bins' content: the source's identity (for local files, their paths
    and CONTENT, not their mtime), tokenizer, split and format. -> (fingerprint, the files' records)."""
    identity = dict(source.identity)
    files = None
    if source.files is not None:
        files = _file_hashes(source.files, previous)
        identity["files"] = [[path, sha] for path, _, _, sha in files]
    settings = {
        "format_version": FORMAT_VERSION,
        "source": identity,
        "tokenizer": cfg.tokenizer,
        "val_fraction": cfg.val_fraction,
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest(), files


def _rebuild_reason(out: Path, tokenizer: str, fingerprint: str) -> str | None:
    """None if `out` is current, "" if it's new, else why it must be rebuilt.

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
        return "" if not out.exists() or not any(out.iterdir()) else f"{META_NAME} is missing"
    if isinstance(raw.get("tokenizer"), str) and raw["tokenizer"] != tokenizer:
        raise UserError(
            f"{out} holds data prepared with tokenizer {raw['tokenizer']!r}, not {tokenizer!r}; move it away "
            f"(or use another data.root) and prepare again"
        )
    try:
        meta = load_meta(out)
    except UserError as e:
        return str(e).split(";")[0]
    if meta["fingerprint"] != fingerprint:
        return "the source or the split settings changed since it was prepared"
    return None


def _threads(cfg: DataConfig) -> int:
    if cfg.num_proc:
        return cfg.num_proc
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _progress_bar(source: Source, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=source.total, unit=source.unit, unit_scale=True, desc=desc, disable=not enabled, file=sys.stderr)


def _char_vocab(source: Source, progress: bool) -> str:
    """First pass for the char tokenizer: every character of the source (both splits), sorted."""
    seen: set[str] = set()
    with _progress_bar(source, "scanning characters", progress) as bar:
        for _, text, advance in source.pieces():
            seen.update(text)
            bar.update(advance)
    return "".join(sorted(seen))


def _encoded(source: Source, tok: Tokenizer, threads: int) -> Iterator[tuple[bool, np.ndarray, int]]:
    """The source's pieces, tokenized in batches of about BATCH_CHARS on `threads` threads, in order."""
    batch: list[tuple[bool, str, int]] = []
    size = 0

    def flush() -> Iterator[tuple[bool, np.ndarray, int]]:
        ids = tok.encode_arrays([text for _, text, _ in batch], num_threads=threads)
        for (new_doc, _, advance), arr in zip(batch, ids):
            yield new_doc, arr, advance

    for piece in source.pieces():
        batch.append(piece)
        size += len(piece[1])
        if size >= BATCH_CHARS:
            yield from flush()
            batch, size = [], 0
    yield from flush()


def _write_stream(f, source: Source, tok: Tokenizer, dtype: np.dtype, threads: int, progress: bool) -> tuple[int, int, int]:
    """Write the whole token stream to `f`; return (tokens, bytes, documents)."""
    byte_lengths = tok.token_byte_lengths()
    eot = np.array([tok.eot], dtype=dtype).tobytes()
    n_tokens = n_bytes = n_docs = 0
    doc_started = False  # has the current document written any tokens yet?
    with _progress_bar(source, f"tokenizing ({tok.name})", progress) as bar:
        for new_doc, ids, advance in _encoded(source, tok, threads):
            if new_doc:
                doc_started = False
            if len(ids) and int(ids.max()) >= tok.vocab_size:  # a tokenizer bug, never user data: say so
                raise UserError(f"the {tok.name} tokenizer produced id {int(ids.max())} >= its vocab_size "
                                f"{tok.vocab_size}; update tiktoken, or report this")
            if len(ids):
                if not doc_started:
                    if n_docs:
                        f.write(eot)
                        n_tokens += 1
                    n_docs += 1
                    doc_started = True
                f.write(ids.astype(dtype).tobytes())
                n_tokens += len(ids)
                n_bytes += int(byte_lengths[ids].sum())
            bar.update(advance)
    return n_tokens, n_bytes, n_docs


def _move_tail(stream: Path, val: Path, n_train: int, dtype: np.dtype, byte_lengths: np.ndarray) -> int:
    """Move the tokens after `n_train` from `stream` into `val` in bounded chunks; return their bytes."""
    n_bytes = 0
    with open(stream, "r+b") as src, open(val, "wb") as dst:
        src.seek(n_train * dtype.itemsize)
        while chunk := src.read(COPY_TOKENS * dtype.itemsize):
            ids = np.frombuffer(chunk, dtype=dtype)
            n_bytes += int(byte_lengths[ids].sum())
            dst.write(chunk)
        src.truncate(n_train * dtype.itemsize)
        for f in (src, dst):
            f.flush()
            os.fsync(f.fileno())
    return n_bytes


def _tokens_sha256(paths: list[Path]) -> str:
    """A fingerprint of the tokens themselves: what a resumed run checks it trains on (BatchLoader)."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(16 << 20):
                h.update(chunk)
        h.update(b"|")  # train then val: the same tokens split elsewhere differ
    return h.hexdigest()


def _build(out: Path, cfg: DataConfig, source: Source, fingerprint: str, files: list | None, progress: bool) -> None:
    try:
        _write_dir(out, cfg, source, fingerprint, files, progress)
    except OSError as e:  # a full disk, a read-only filesystem, ...: the old data (if any) is as it was
        raise UserError(f"cannot write prepared data in {out} ({short_error(e)}); free some space or set data.root "
                        "to another disk (the previous data, if any, is kept)") from None


def _write_dir(out: Path, cfg: DataConfig, source: Source, fingerprint: str, files: list | None, progress: bool) -> None:
    if cfg.tokenizer == CHAR:
        chars = _char_vocab(source, progress)
        if not chars:
            raise _empty(cfg)
        tok: Tokenizer = CharTokenizer(chars)
    else:
        tok = get_tokenizer(cfg.tokenizer)
    dtype = np.dtype(np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32)

    created = not any(p.name != ".prepare.lock" for p in out.iterdir()) if out.exists() else True
    out.mkdir(parents=True, exist_ok=True)
    final = {name: out / name for name in ("train.bin", "val.bin", META_NAME)}
    temps = {name: temp_path(path) for name, path in final.items()}
    try:
        with open(temps["train.bin"], "wb") as f:
            n_tokens, n_bytes, n_docs = _write_stream(f, source, tok, dtype, _threads(cfg), progress)
        if n_tokens == 0:
            raise _empty(cfg)
        n_val = int(n_tokens * cfg.val_fraction)
        n_train = n_tokens - n_val
        if n_val == 0 or n_train == 0:
            raise UserError(
                f"data.dataset {cfg.dataset!r} has only {n_tokens} tokens, too few to hold out val_fraction "
                f"{cfg.val_fraction} of them; use more text or a larger val_fraction"
            )
        val_bytes = _move_tail(temps["train.bin"], temps["val.bin"], n_train, dtype, tok.token_byte_lengths())
        meta = {
            "tokens_sha256": _tokens_sha256([temps["train.bin"], temps["val.bin"]]),
            "format_version": FORMAT_VERSION,
            "source": cfg.dataset,
            "tokenizer": tok.name,
            "vocab_size": tok.vocab_size,
            "eot": tok.eot,
            "dtype": dtype.name,
            "chars": tok.chars,
            "fingerprint": fingerprint,
            "source_files": files,
            "val_fraction": cfg.val_fraction,
            "documents": n_docs,
            "splits": {
                "train": {"tokens": n_train, "bytes": n_bytes - val_bytes},
                "val": {"tokens": n_val, "bytes": val_bytes},
            },
        }
        write_synced(temps[META_NAME], (json.dumps(meta, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
        # Everything new is complete and synced. Remove the old meta.json first and write the new one
        # last: a crash in between leaves a dir without meta.json, which the next prepare rebuilds.
        final[META_NAME].unlink(missing_ok=True)
        for name in ("train.bin", "val.bin", META_NAME):
            os.replace(temps[name], final[name])
        fsync_dir(out)
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        if created and not any(p.name != ".prepare.lock" for p in out.iterdir()):
            shutil.rmtree(out, ignore_errors=True)  # a failed first build leaves no empty dir behind


def _empty(cfg: DataConfig) -> UserError:
    return UserError(f"data.dataset {cfg.dataset!r} contains no text; point it at non-empty text")
