"""Preparing a directory: is the prepared dir for a config current (its fingerprint matches and its tokens check
out)? If not, build it, rebuild it (saying why) or resume a killed build, under its lock and never under a live
reader. The format: manifest.py; writing a build: build_writer.py."""
from __future__ import annotations

import glob
import itertools
import os
import re
import shutil
from pathlib import Path

from bounded import TooLargeError
from errors import UserError, to_stderr
from fileio import check_output_not_input, check_writable_dir, no_empty_dirs_left
from locks import DirLock, remove_stale_temps
from ownership import DATA, check_parent, check_target

from .build_writer import write_build
from .config import HF_PREFIX, SHAKESPEARE, DataConfig
from .fingerprint import SOURCE_RECORDS, build_fingerprint, previous_records, v1_fingerprint
from .holds import PREPARE_LOCK, READERS, check_readers_dir, live_readers, wait_for_lock
from .manifest import META_NAME, load_meta, read_meta_json, read_meta_quietly, verify_tokens
from .sources import Source, open_source

DEFAULT_VAL_FRACTION = DataConfig.val_fraction


def prepare_data(cfg: DataConfig, *, progress: bool = True, resumes: tuple[str, str] | None = None) -> Path:
    """Make sure the prepared dir for `cfg` exists, is current and undamaged; return its path.

    Skips the work when the stored fingerprint matches and the tokens check out, rebuilds (saying why)
    when they don't, resumes a prepare that was killed, and refuses to rebuild a dir a live training
    run reads (hold_data). `resumes`: (a checkpoint, the tokens_sha256 it trained on): a dir holding those
    tokens whose source changed is refused, not rebuilt (a rebuild would remove the only copy of them), and a
    dir that holds other tokens once prepared (prepared anew since, from changed data) is refused too.
    """
    cfg.validate()
    with no_empty_dirs_left(cfg.root):  # a refusal (or a failure) leaves no empty data.root behind
        out = _prepare_data(cfg, progress, resumes)
    if resumes:
        _check_trained_on(out, cfg, resumes)
    return out


def _prepare_data(cfg: DataConfig, progress: bool, resumes: tuple[str, str] | None = None) -> Path:
    check_parent(cfg.root, DATA, "data.root")  # before data.root is created
    # nor inside a source it reads: the next prepare would read this one's meta.json (a .json) as a source
    read, matched = _sources_read(cfg)
    check_output_not_input(cfg.root, [(f"the source {s}", s) for s in read], "data.root")
    root = Path(os.path.realpath(os.path.expanduser(cfg.root)))
    mine = next((f for f in matched if root in Path(os.path.realpath(f)).parents), None)
    if mine is not None:  # a glob matching a prepared folder's files: the prepare would read an earlier one's output
        raise UserError(f"data.dataset's pattern matches {mine}, inside data.root {root}: a prepare would read what "
                        "an earlier one wrote; narrow the pattern (e.g. *.txt) or set data.root outside what it matches")
    check_writable_dir(cfg.root, "data.root")
    main_source, val_source = _open_sources(cfg)
    _check_shard_count(cfg, main_source, val_source)
    out = Path(cfg.root) / dir_name(cfg, main_source, val_source)
    _check_not_matched(cfg, out)
    _check_is_dir(out)
    check_target(out, DATA, "data.root")  # not another command's folder, and none of theirs inside it
    fingerprint, files = build_fingerprint(cfg, main_source, val_source, previous_records(out))
    reason = _rebuild_reason(out, cfg, fingerprint, files)
    if reason is None:  # (a format-1 dir whose tokens still stand is kept: its old fingerprint is not refused)
        if progress:
            to_stderr(f"{out} is up to date")
        return out
    _check_resumed_tokens(out, cfg, fingerprint, files, resumes)  # before the lock: a refusal creates nothing
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    lock = wait_for_lock(DirLock(out, PREPARE_LOCK, what="preparing"), out)
    try:
        reason = _rebuild_reason(out, cfg, fingerprint, files)  # another process may just have built it
        if reason is None:
            return out
        _check_resumed_tokens(out, cfg, fingerprint, files, resumes)
        _check_in_the_way(out, fingerprint[:12])
        if reason and (reader := live_readers(out)):
            raise UserError(f"refusing to rebuild {out} ({reason}): it is read by {reader['what']} (pid {reader['pid']}); "
                            f"stop that run first, or prepare into another data.root")
        for stale in remove_stale_temps(out):
            to_stderr(f"removed {stale}, left by a prepare that was killed")
        if reason:
            to_stderr(f"rebuilding {out}: {reason}")
        write_build(out, cfg, main_source, val_source, fingerprint, files, progress)
    finally:
        lock.release()
        if created and out.is_dir() and not any(out.iterdir()):
            shutil.rmtree(out, ignore_errors=True)  # a failed first build leaves no empty dir behind
    if progress:
        to_stderr(f"prepared {out}")
    return out


def _check_resumed_tokens(out: Path, cfg: DataConfig, fingerprint: str, files: list | None,
                          resumes: tuple[str, str] | None) -> None:
    """Refuse to rebuild the tokens a resumed run trained on because its source changed: the run could not
    resume on the new tokens anyway, and the rebuild would remove the old ones (the source they came from may
    be gone: edited in place). A damaged dir (same fingerprint) is still rebuilt: it comes out the same."""
    meta = read_meta_quietly(out) if resumes else None
    if not isinstance(meta, dict) or meta.get("tokens_sha256") != resumes[1] or meta.get("fingerprint") == fingerprint:
        return
    raise UserError(f"data.dataset {cfg.dataset!r}: {what_changed(meta, files)} since the checkpoint {resumes[0]} was written, and a run "
                    f"resumes only on the tokens it trained on (kept in {out}); put the original data back, or train "
                    f"into a new --train.out_dir")


def what_changed(meta: dict, files: list | None) -> str:
    """Which source files differ between a prepared dir's record and the sources now (a clause): their content
    changed, or one is new or gone; else the settings that shape the tokens changed."""
    before = {r[0]: r[3] for r in meta.get("source_files") or [] if isinstance(r, list) and len(r) == 4}
    now = {r[0]: r[3] for r in files or []}
    changed = sorted(p for p in before.keys() | now.keys() if before.get(p) != now.get(p))
    if not changed:
        return "the settings that shape its tokens changed"
    words = [f"{p} ({'new' if p not in before else 'gone' if p not in now else 'edited'})" for p in changed[:3]]
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return f"the source file{'s' if len(changed) > 1 else ''} {', '.join(words)}{more} changed"


def _check_trained_on(out: Path, cfg: DataConfig, resumes: tuple[str, str]) -> None:
    """The prepared dir holds the tokens the resumed run trained on: not when the data changed and was prepared
    anew before this run (by `python -m data.prepare`), or the dir held other tokens and was rebuilt."""
    now = load_meta(out)["tokens_sha256"]
    if now != resumes[1]:
        raise UserError(f"the data of data.dataset {cfg.dataset!r} changed since the checkpoint {resumes[0]} was "
                        f"written (tokens {resumes[1][:12]} then, {now[:12]} now in {out}), and a run resumes only on "
                        "the tokens it trained on; put the original data back, or train into a new --train.out_dir")


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
    check_readers_dir(out)


def dir_name(cfg: DataConfig, source: Source, val_source: Source | None) -> str:
    """The prepared dir's name: source, tokenizer, and the split when it is not the default, so two
    splits of one source are two dirs (a prepare with another val_fraction never rebuilds the dir a
    run is reading)."""
    name = f"{source.slug}-{cfg.tokenizer.replace(':', '')}" + ("-chat" if cfg.format == "chat" else "")
    if val_source is not None:
        return f"{name}-val-{val_source.slug}"
    if cfg.val_fraction != DEFAULT_VAL_FRACTION:
        return f"{name}-val{cfg.val_fraction:g}"
    return name


def _sources_read(cfg: DataConfig) -> tuple[list[Path], list[Path]]:
    """The local files and folders a prepare reads (a glob: the files it matches now, so a data.root under
    the folder a `*.txt` pattern starts in is fine, while one whose files the pattern would match is not;
    hf:<folder>, a local dataset folder). -> (everything read, the files globs matched)"""
    specs = []
    for s in (cfg.dataset, cfg.val_dataset):
        if s.startswith(HF_PREFIX) and os.path.lexists(os.path.expanduser(s[len(HF_PREFIX):])):
            specs.append(s[len(HF_PREFIX):])
        elif s and s != SHAKESPEARE and not s.startswith(HF_PREFIX):
            specs.append(s)
    read: list[Path] = []
    matched: list[Path] = []
    for s in specs:
        if re.search(r"[*?[]", s):
            matched += [Path(p) for p in itertools.islice(glob.iglob(os.path.expanduser(s), recursive=True), GLOB_LIMIT)]
        else:
            read.append(Path(os.path.expanduser(s)))
    return read + matched, matched


def _check_not_matched(cfg: DataConfig, out: Path) -> None:
    """No glob of the data's matches a file this prepare writes into `out`, before any is written: the glob's files
    found now (_sources_read) hold none on a first prepare, which then passed, and every later one was refused."""
    written = [os.path.abspath(out / name) for name in (META_NAME, "train-0-00000.bin", "val-0-00000.bin")]
    for spec in (cfg.dataset, cfg.val_dataset):
        if spec and not spec.startswith(HF_PREFIX) and re.search(r"[*?[]", spec):
            pattern = glob_regex(os.path.abspath(os.path.expanduser(spec)))
            mine = next((f for f in written if pattern.fullmatch(f)), None)
            if mine is not None:
                raise UserError(f"data.dataset's pattern {spec!r} would match {mine}, which this prepare writes (data.root "
                                f"{cfg.root}): a later prepare would read it; narrow the pattern (e.g. *.txt) or set "
                                "data.root outside what it matches")


def glob_regex(pattern: str) -> re.Pattern:
    """glob.glob's matching (recursive=True) as a regex over whole paths: `**` a run of folders, `*` and `?` within
    one name, not its leading dot, `[...]` a class."""
    parts, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            parts.append(r"(?:[^/.][^/]*/)*")
            i += 3
        elif pattern.startswith("**", i) and (i == 0 or pattern[i - 1] == "/") and i + 2 == len(pattern):
            parts.append(r"(?:[^/.][^/]*(?:/[^/.][^/]*)*)?")
            i += 2
        elif pattern[i] in "*?":
            first = i == 0 or pattern[i - 1] == "/"
            parts.append(("(?![.])" if first else "") + (r"[^/]*" if pattern[i] == "*" else r"[^/]"))
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2:]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1:end]
            first = i == 0 or pattern[i - 1] == "/"
            parts.append(("(?![.])" if first else "") + "["
                         + ("^" + re.escape(body[1:]) if body.startswith("!") else re.escape(body)) + "]")
            i = end + 1
        else:
            parts.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(parts))


GLOB_LIMIT = 100_000  # the files of a glob compared with data.root (a pattern over a whole disk is not walked whole)


MAX_SHARD_FILES = 100_000  # past this many files a folder is slow to list, and the shard size is a typo


def _check_shard_count(cfg: DataConfig, *sources: Source | None) -> None:
    """Refuse a data.shard_tokens that would write more than MAX_SHARD_FILES files (1: one file per
    token), before the prepare starts. Every tokenizer here makes at most one token per byte, so the
    sources' bytes bound the tokens; a source of unknown size (an HF dataset) is not checked."""
    sized = [s for s in sources if s is not None]
    if not sized or any(s.unit != "B" or s.total is None for s in sized):
        return
    total = sum(s.total for s in sized)
    if total / cfg.shard_tokens > MAX_SHARD_FILES:
        works = max(-(-total // MAX_SHARD_FILES), 1)
        raise UserError(f"data.shard_tokens={cfg.shard_tokens} would split these {total:,} bytes of source into up to "
                        f"{-(-total // cfg.shard_tokens):,} files, over the {MAX_SHARD_FILES:,} a prepare writes; set "
                        f"data.shard_tokens to at least {works:,} (the default is {DataConfig.shard_tokens:,})")


def _open_sources(cfg: DataConfig) -> tuple[Source, Source | None]:
    if not cfg.val_dataset:
        return open_source(cfg), None
    main = open_source(cfg, tail_split=False)
    val = open_source(cfg, cfg.val_dataset, tail_split=False, key="data.val_dataset")
    _check_val_apart(main, val)
    return main, val


def _check_val_apart(main: Source, val: Source) -> None:
    """The val source must hold none of the training data: the config compares the two settings as written,
    but 'corpus/' and './corpus', or a file inside the training folder, name the same files (every val
    loss would then be a train loss, silently). Compared by what the sources read: their resolved files,
    or the whole identity of a source without files (an HF dataset)."""
    shared = sorted({os.path.realpath(f) for f in main.files or []} & {os.path.realpath(f) for f in val.files or []})
    if shared or (main.files is None and val.files is None and main.identity == val.identity):
        what = f"{shared[0]}{f' and {len(shared) - 1:,} more files' if len(shared) > 1 else ''}" if shared else "the same data"
        raise UserError(f"data.val_dataset and data.dataset both read {what}: the val split would hold training data; "
                        "name a val source apart from the training files, or leave data.val_dataset empty to hold "
                        "out val_fraction of the documents")


def _v1_fingerprint(cfg: DataConfig, meta: dict) -> str | None:
    """What format v1 stored as the fingerprint of these settings (None for a v2 dir, or where v1 could not have
    held them)."""
    if cfg.val_dataset or meta.get("format_version") != 1:
        return None
    try:
        source = open_source(cfg)
    except UserError:
        return None
    return v1_fingerprint(cfg, source, meta)


def _rebuild_reason(out: Path, cfg: DataConfig, fingerprint: str, files: list | None = None) -> str | None:
    """None if `out` is current and its tokens check out, "" if it's new, else why it must be rebuilt.

    Raises instead when `out` holds another tokenizer's data: that dir was renamed or copied by hand,
    and overwriting it would destroy data that is good, just misplaced.
    """
    if (out / META_NAME).exists() and not (out / META_NAME).is_file():  # rebuilding can't fix that: say so
        read_meta_json(out)
    # The part of a UserError before ";" names the problem; its fix ("re-run prepare") is what we're doing.
    try:
        raw = read_meta_json(out)
    except TooLargeError:  # (a file no prepare wrote: not replaced)
        raise
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
    except TooLargeError:  # (its tokenizer.json: the same)
        raise
    except UserError as e:
        return str(e).split(";")[0]
    if meta["fingerprint"] != fingerprint and meta["fingerprint"] != _v1_fingerprint(cfg, meta):
        return f"{what_changed(meta, files)} since it was prepared"
    return verify_tokens(out, meta)
