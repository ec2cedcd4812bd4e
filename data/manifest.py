"""A prepared directory's manifest (meta.json): what it records, reading and checking it, and checking the
token files against it.

Format (version 2; see data/README.md):
- `<split>-<build>-<n>.bin`: each split's token stream (documents joined by the tokenizer's eot, none
  before the first or after the last; empty documents skipped) as flat little-endian uint16 (vocab <=
  65536) or uint32, cut into shards of exactly `shard_tokens` tokens (the last one shorter). `<build>`
  is the start of the fingerprint, so a rebuild writes beside the data it replaces.
- The val split: the documents whose hash falls under val_fraction (shards.doc_in_val), so it does not
  depend on file names or order; of a single text file (one document), its tail (the last val_fraction
  of its bytes, from the first place after that where the tokens come out as for the whole text); with
  data.val_dataset, that source.
- `meta.json`, the manifest: see `manifest` below. It is written last and replaced atomically: a
  prepare that fails or is killed leaves the previous data as it was, and a killed one resumes
  (shards.py). `bytes` per split is the UTF-8 size of the text its tokens stand for, for bits-per-byte.

Format version 1 (train.bin, val.bin, the last val_fraction of the tokens as val) still loads.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from bounded import TooLargeError, read_own
from errors import UserError
from fileio import json_loads
from ownership import MANIFEST_MAX

from .config import DataConfig
from .shards import MOVE_AWAY, SPLITS, file_sha256, sample_sha256
from .tokenizer import CHAR, Tokenizer, bpe_vocab_size

FORMAT_VERSION = 2
READS = (1, 2)  # format versions load_meta reads
META_NAME = "meta.json"
VERIFY_ALL = 1 << 30  # up to this many bytes of tokens, a start-up check hashes them all; above, samples
# prepare rebuilds any dir it finds unusable, so this is the fix for every broken-data error
REBUILD = "re-run `python -m data.prepare` with the same settings to rebuild it"
TOKENIZER_MAX = 256 << 20  # bytes: a trained BPE's tokenizer.json (bpe:1048576, the largest, is ~100 MB)


def plain_name(name) -> bool:
    """A file name meta.json may hold (a shard's, the tokenizer's): a name inside the prepared folder, never a path
    that leads out of it (`../x`, `/etc/x`) or no file at all (`.`, `..`, a NUL byte)."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def load_meta(data_dir: str | os.PathLike, tokenizer: str | None = None) -> dict:
    """Read and check `data_dir/meta.json` and the token files' sizes; with `tokenizer`, also that it
    matches. A trained BPE's tokenizer.json comes back as meta["bpe"]."""
    data_dir = Path(data_dir)
    path = data_dir / META_NAME
    meta = read_meta_json(data_dir)
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
                plain_name(sh["name"]) and isinstance(sh["tokens"], int)
                and sh["tokens"] > 0 and isinstance(sh["sha256"], str) and isinstance(sh["sample_sha256"], str)
                for s in SPLITS for sh in meta["shards"][s]
            ) and (meta.get("tokenizer_file") is None or plain_name(meta["tokenizer_file"]))
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
            meta["bpe"] = read_own(tok_path, "a trained tokenizer's tokenizer.json", limit=TOKENIZER_MAX,
                                   fix=MOVE_AWAY).decode("utf-8")
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


def read_meta_json(data_dir: Path) -> dict | None:
    path = data_dir / META_NAME
    if path.exists() and not path.is_file():  # a folder (or a device): "free some space" would be wrong advice
        raise UserError(f"{path} is not a file; move it away (the prepared data's metadata goes there), then rerun")
    if not path.exists():
        return None
    try:  # bounded: one over a manifest's size is refused (TooLargeError: no rebuild replaces it), not read
        meta = json_loads(read_own(path, "a prepared folder's manifest (JSON)", limit=MANIFEST_MAX, fix=MOVE_AWAY))
    except (ValueError, UnicodeDecodeError, IsADirectoryError):
        raise UserError(f"{path} is not valid JSON; {REBUILD}") from None
    if not isinstance(meta, dict):
        raise UserError(f"{path} is not a JSON object; {REBUILD}")
    return meta


def read_meta_quietly(out: Path) -> dict | None:
    try:
        return read_meta_json(out)
    except TooLargeError:  # not ours, nor rebuilt over: said at once
        raise
    except UserError:
        return None


def json_sha256(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def manifest(cfg: DataConfig, tok: Tokenizer, dtype: np.dtype, fingerprint: str, files: list | None, result: dict,
              tok_record: dict, skipped: list) -> dict:
    shard_lists = {s: result[s]["shards"] for s in SPLITS}
    return {
        # the tokens themselves, through the shards' checksums: what a resumed run checks it trains on
        "tokens_sha256": json_sha256([[sh["sha256"] for sh in shard_lists[s]] for s in SPLITS]),
        "format_version": FORMAT_VERSION,
        "source": cfg.dataset,
        "val_dataset": cfg.val_dataset or None,
        "tokenizer": tok.name,
        "vocab_size": tok.vocab_size,
        "eot": tok.eot,
        "dtype": dtype.name,
        "chars": tok.chars,
        **{k: v for k, v in tok_record.items() if k != "chars"},
        "tokenizer_fingerprint": json_sha256([tok.name, tok.vocab_size, tok.chars, tok_record.get("tokenizer_sha256")]),
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
