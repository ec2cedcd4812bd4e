"""Writing one build of a prepared directory: its tokenizer (a char vocabulary scanned, a BPE trained), the
sources' pieces through the shard writer (shards.py), the manifest switched over, the previous build removed."""
from __future__ import annotations

import hashlib
from collections import Counter
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from bounded import read_own
from errors import UserError, short_error, to_stderr, write_fix
from fileio import atomic_write_bytes, fsync_dir

from .chat_prep import ChatWriterTokenizer, chat_record, contents
from .config import CHAT, DataConfig
from .conversations import fault_kind, skip_counts, skip_report
from .formats import text_fault_kind
from .fingerprint import SOURCE_RECORDS
from .holds import PREPARE_LOCK, READERS
from .manifest import META_NAME, TOKENIZER_MAX, manifest, read_meta_quietly
from .pieces import Piece, Source
from .shards import BUILD_FILE, INLINE_BELOW, MOVE_AWAY, SPLITS, doc_in_val, load_resume_state, peak_memory_mb, write_shards
from .tokenizer import CHAR, CharTokenizer, Tokenizer, bpe_vocab_size, get_tokenizer, train_bpe


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


def _char_vocab(source: Source, val_source: Source | None, progress: bool, chat: bool = False) -> str:
    """First pass for the char tokenizer: every character of the sources (both splits), sorted (of
    conversations, of their contents only)."""
    seen: set[str] = set()
    with _progress_bar(source.total, source.unit, "scanning characters", progress) as bar:
        for piece in _chained(source, val_source, None):
            seen.update(contents(piece.text) if chat and piece.text else piece.text)
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
            text = contents(piece.text, "\n") if cfg.format == "chat" and piece.text else piece.text
            taken += len(text)
            yield text


def _tokenizer_for(out: Path, build: str, cfg: DataConfig, source: Source, val_source: Source | None,
                   resume: dict | None, progress: bool) -> tuple[Tokenizer, dict]:
    """The tokenizer and what the manifest records of it ({"chars"} / {"tokenizer_file", ...})."""
    if cfg.tokenizer == CHAR:
        chars = resume["chars"] if resume else _char_vocab(source, val_source, progress, cfg.format == "chat")
        if not chars:
            raise _empty(cfg, [row for src in (source, val_source) if src is not None for row in src.skipped])
        return CharTokenizer(chars), {"chars": chars}
    vocab = bpe_vocab_size(cfg.tokenizer)
    if vocab is None:
        return get_tokenizer(cfg.tokenizer), {}
    path = out / f"tokenizer-{build}.json"
    # bounded: a file at its name past a tokenizer's size is refused, not read (nor trained over)
    raw = read_own(path, "a trained tokenizer's tokenizer.json", limit=TOKENIZER_MAX, fix=MOVE_AWAY) \
        if resume and path.is_file() else None
    if raw is not None and hashlib.sha256(raw).hexdigest() == resume.get("tokenizer_sha256"):
        text = raw.decode("utf-8")
    else:
        if progress:
            to_stderr(f"training the {cfg.tokenizer} tokenizer on up to {cfg.tokenizer_sample_mb} MB of the corpus")
        text = train_bpe(_bpe_sample(source, val_source, cfg), vocab)
        atomic_write_bytes(path, text.encode("utf-8"))
    tok = get_tokenizer(cfg.tokenizer, bpe=text)
    return tok, {"tokenizer_file": path.name, "tokenizer_sha256": hashlib.sha256(text.encode()).hexdigest()}


BYTES_PER_WORKER = 4096  # no process without at least this much of the source to tokenize


def _workers(cfg: DataConfig, source: Source, val_source: Source | None) -> int:
    n = cfg.num_proc
    if not n:
        try:
            n = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            n = os.cpu_count() or 1
    total = sum(s.total or 0 for s in (source, val_source) if s is not None)
    sized = all(s.unit == "B" and s.total is not None for s in (source, val_source) if s is not None)
    if sized and total < INLINE_BELOW and not cfg.num_proc:
        return 1  # a small source: starting processes would cost more than they save
    if sized:  # never more processes than there is work for (data.num_proc=1000 on 60 kB: 1000 idle starts)
        n = min(n, max(1, total // BYTES_PER_WORKER))
    return n


def write_build(out: Path, cfg: DataConfig, source: Source, val_source: Source | None, fingerprint: str,
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
    resume = load_resume_state(out, build, fingerprint, to_stderr)
    previous = read_meta_quietly(out)  # what the data being replaced consists of: all a rebuild may remove
    if files:  # removed with the other build files once the manifest (which holds them too) is written
        atomic_write_bytes(out / SOURCE_RECORDS, json.dumps(files).encode())
    tok, tok_record = _tokenizer_for(out, build, cfg, source, val_source, resume, progress)
    # conversations: ids and loss mask stored together, 2 * id + counted (chat_prep.py)
    writer_tok = ChatWriterTokenizer(tok) if cfg.format == "chat" else tok
    dtype = dtype_of(writer_tok)
    skipped = list(resume.get("skipped", [])) if resume else []
    for src in (source, val_source):
        if src is not None:
            src.skipped.clear()
    if resume:
        done = sum(len(resume["splits"][s]["shards"]) for s in SPLITS)
        to_stderr(f"resuming the interrupted prepare of {out}: {done} finished shard(s) kept")

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
            out, build, fingerprint, _chained(source, val_source, resume["pos"] if resume else None), writer_tok,
            shard_tokens=cfg.shard_tokens, val_fraction=cfg.val_fraction, workers=workers, resume=resume,
            extra_state=extra_state, bar=bar, say=to_stderr)
    n_tokens = sum(result[s]["tokens"] for s in SPLITS)
    if n_tokens == 0:
        raise _empty(cfg, skipped_now())
    for split in SPLITS:
        if result[split]["tokens"] == 0:
            own = (val_source if split == "val" else source).skipped if val_source is not None else []
            raise _one_split_empty(cfg, split, sum(result[s]["docs"] for s in SPLITS), n_tokens, own)
    skipped_rows = skipped_now()
    if skipped_rows:
        first = skipped_rows[0]
        to_stderr(f"skipped {len(skipped_rows)} bad row(s) (data.skip_bad_rows); the first: {first[0]}, row {first[1]}: {first[2]}")
        if cfg.format == CHAT:  # and how many of each fault
            to_stderr(skip_report(skip_counts(skipped_rows)))
    meta = manifest(cfg, tok, dtype, fingerprint, files, result, tok_record, skipped_rows)
    if cfg.format == "chat":
        meta["chat"] = chat_record(tok)
    # Everything new is complete and synced: switch the manifest over, then remove the old data.
    atomic_write_bytes(out / META_NAME, (json.dumps(meta, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    _remove_previous(out, meta, previous)
    fsync_dir(out)
    if progress:
        main_mb, child_mb = peak_memory_mb()
        to_stderr(f"peak memory: {main_mb:.0f} MB in this process" + (f", {child_mb:.0f} MB in the largest tokenizer process"
                                                                   if workers > 1 else ""))


def _remove_previous(out: Path, meta: dict, previous: dict | None) -> None:
    """Remove what the build replaced: the files `previous` (the replaced manifest) names, and the files a
    prepare writes under its own names (killed builds' shards, partials and resume records). Anything else
    is not ours (a file someone put there): it is left alone, and one line says so."""
    keep = {sh["name"] for s in SPLITS for sh in meta["shards"][s]} | {META_NAME, PREPARE_LOCK, READERS}
    keep |= {meta["tokenizer_file"]} if meta.get("tokenizer_file") else set()
    named = _named_by(previous) - keep
    left = []
    for p in sorted(out.iterdir()):
        if p.name in keep or not p.is_file() or p.name.endswith(".tmp"):  # temps: remove_stale_temps' (pid-aware)
            continue
        if p.name in named or BUILD_FILE.fullmatch(p.name):
            p.unlink(missing_ok=True)
        else:
            left.append(p.name)
    if left:
        to_stderr(f"left {len(left)} file(s) in {out} that no manifest of it names (not the prepare's to remove): "
                  f"{', '.join(left[:5])}{', ...' if len(left) > 5 else ''}")


def _named_by(meta: dict | None) -> set[str]:
    """The file names a manifest (of format 1 or 2) names, read defensively: it may be damaged."""
    if not isinstance(meta, dict):
        return set()
    if meta.get("format_version") == 1:
        return {f"{s}.bin" for s in SPLITS}
    names = {meta.get("tokenizer_file")}
    shards = meta.get("shards")
    for split in shards.values() if isinstance(shards, dict) else ():
        names |= {sh.get("name") for sh in split if isinstance(sh, dict)} if isinstance(split, list) else set()
    return {n for n in names if isinstance(n, str) and n and "/" not in n and n not in (".", "..")}


def _empty(cfg: DataConfig, skipped: list, which: str = "data.dataset") -> UserError:
    """No text at all. Where bad rows were skipped, that is why: say so, with the count per fault and the first
    fault (which carries its own fix, e.g. data.text_field), not "point it at non-empty text"."""
    spec = getattr(cfg, which.split(".")[1])
    if not skipped:
        return UserError(f"{which} {spec!r} contains no text; point it at non-empty text")
    kind_of = fault_kind if cfg.format == CHAT else text_fault_kind
    counts = Counter(kind_of(row[2]) for row in skipped)
    per_fault = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    (file, row, why), fix = skipped[0], "" if "(set data." in skipped[0][2] else "; fix those rows"
    return UserError(f"{which} {spec!r} has no text left: all {len(skipped)} of its rows with content were skipped as bad "
                     f"(data.skip_bad_rows), {per_fault}; the first, {file}, row {row}: {why}{fix}")


def _one_split_empty(cfg: DataConfig, split: str, docs: int, tokens: int, skipped: list) -> UserError:
    if cfg.val_dataset:
        return _empty(cfg, skipped, "data.val_dataset" if split == "val" else "data.dataset")
    return UserError(
        f"data.dataset {cfg.dataset!r} has {docs} document(s) ({tokens} tokens) and none fell into the {split} "
        f"split (val holds the documents whose hash falls under val_fraction {cfg.val_fraction}); use more "
        f"documents or another val_fraction, or name a val source with data.val_dataset"
    )
