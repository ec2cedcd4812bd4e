"""One folder, one owner: every folder this project writes says what it is, and no command writes into a
folder of another kind, inside one, or around one.

THE GATE: every command that writes calls, before any work, with the path it will write and the kind of
folder it manages there (None: a file or folder of the user's, e.g. `--out samples.txt`):

    out = check_output(args.out, "--out")                              # sample, inspect, plot, bench, chat, serve
    out = check_output(cfg.train.out_dir, "train.out_dir", kind=OUT_DIR)  # a folder the command manages
    out = check_output(args.out, "--out", reading=(checkpoint,))      # never in (or around) what it reads

It refuses in one UserError line (never a traceback) a path value no system call takes (fileio's
check_path_value: empty, NUL, a name over 255 bytes, not UTF-8), an output inside a folder another command
manages (a training out_dir, an HF export, a prepared data folder, a sharded checkpoint), and a managed
folder whose own files are symlinks (they are never written through: fileio.atomic_write / open_own). It
returns the Path to write. tests/entry_points.py lists every entry point (PARSERS) and writer (WRITERS):
a new one adds its row there, and the tests of each class (docs/reliability.md) cover it.

    mark(out_dir, OUT_DIR)                              # a marker file: {"kind": ..., "owner": ...}
    kind_of(path)                                       # OUT_DIR, DATA, EXPORT, CHECKPOINT or None
    check_target(path, DATA, "data.root")               # a one-line UserError naming both folders and the fix

Why: each command knew only its own rules, so two of them could share a folder, and one deleted what the
other wrote (a prepare's rebuild removed the checkpoints of a run whose out_dir was the prepared folder).

A folder says what it is by a marker (MARKER, written by the command that owns it), else by what the
command that owns it has always left there (folders written before the marker existed, and the kinds that
carry no marker): a prepared data folder by its manifest, meta.json (or a build in progress); an export by
config.json and model.safetensors (a marker would travel into every hub upload of it); a sharded checkpoint
by DCP's .metadata; an out_dir by its checkpoints, metrics.jsonl or its lock.

The one nesting allowed: an out_dir holds its own sharded checkpoints (ckpt.dcp/, best.dcp/) directly.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Iterable

from bounded import TooLarge, read_at_most, read_head, read_own
from errors import UserError, short_error, write_fix
from fileio import atomic_write_bytes, check_no_links, check_path_value, json_loads

MARKER = ".smallgpt-owner.json"
# in a folder of the user's that a command writes named files into (data.tasks, eval.inspect, training.plot): the
# size and sha256 of each file it wrote there, so that a later run replaces its own files and no one else's
WRITTEN = ".smallgpt-written.json"
# bytes: compact JSON, ~100 bytes an entry (a name, a size, a sha256) and entries whose file is gone or changed size
# are dropped at each write, so ~10k files of its own live in one folder before a run is refused (64 KiB, with
# indent=1 and nothing dropped, refused a loop of eval.inspect over 720 heads at its 589th)
WRITTEN_MAX = 1 << 20
OUT_DIR, DATA, EXPORT, CHECKPOINT = "out_dir", "data", "export", "checkpoint"
# what each kind is, and who writes it (named in every refusal, so the user knows which setting to move)
WHAT = {OUT_DIR: "a training out_dir", DATA: "a prepared data folder", EXPORT: "an HF export",
        CHECKPOINT: "a sharded checkpoint"}
OWNER = {OUT_DIR: "train.py", DATA: "python -m data.prepare", EXPORT: "python -m checkpoint.export",
         CHECKPOINT: "train.py"}
# what today's code leaves in a folder of each kind without a marker (ownership may import neither data/
# nor checkpoint/, which import it: the names are spelled here, each beside the kind that writes it)
CKPT_NAME, BEST_NAME = "ckpt.pt", "best.pt"  # checkpoint/format.py's names (their one home: light enough for data/)
OUT_DIR_FILES, OUT_DIR_DIRS = (CKPT_NAME, BEST_NAME, "metrics.jsonl", ".train.lock"), ("ckpt.dcp", "best.dcp")
OUT_DIR_NAMES = OUT_DIR_FILES + OUT_DIR_DIRS
DATA_MANIFEST, DATA_LOCK, DATA_BUILD_PREFIX = "meta.json", ".prepare.lock", ".prepare-"
EXPORT_NAMES = ("config.json", "model.safetensors")
DCP_METADATA = ".metadata"
OWN_PARTS = {OUT_DIR: {CHECKPOINT}}  # managed folders a kind holds directly as its own parts
# the files each kind's command names for itself in its folder: never symlinks (checked at the gate, and again
# where each is written)
OWN_NAMES = {OUT_DIR: (MARKER, *OUT_DIR_NAMES), DATA: (MARKER, DATA_MANIFEST, DATA_LOCK),
             EXPORT: (), CHECKPOINT: (DCP_METADATA,)}
# bytes: a marker is one short line; a manifest holds ~200 bytes a shard and a source file (data/manifest.py), and a
# folder corpus has no bound on its files: 512 MiB is ~2.5M of them (128 MiB, ~700k, refused an OpenWebText-like
# corpus of a file per document as "not one prepare wrote")
MARKER_MAX, MANIFEST_MAX = 4096, 512 << 20
MANIFEST_HEAD = 64 << 10  # a manifest's first keys, source (a path) and all, are in its first 64 KiB (_is_manifest)
SCAN_DIRS = 2000  # folders looked into below a target: an out_dir set to a home directory is not walked whole


def mark(path: str | os.PathLike, kind: str) -> None:
    """Write `path`'s marker saying it is a `kind` folder (not again when it already says so)."""
    marker = Path(path) / MARKER
    if _marked(Path(path)) == kind:
        return
    atomic_write_bytes(marker, (json.dumps({"kind": kind, "owner": OWNER[kind]}) + "\n").encode())


def _marked(path: Path) -> str | None:
    try:  # bounded (4096 '[' are past the parser's depth): a huge one is refused, never read nor replaced by mark()
        info = json_loads(read_own(path / MARKER, "an owner marker (one line of JSON: what kind of folder this is)",
                                   limit=MARKER_MAX, fix="it is not one of ours: move it away, then rerun"))
    except (OSError, ValueError):  # none, unreadable or damaged: recognised by its contents instead
        return None
    kind = info.get("kind") if isinstance(info, dict) else None
    return kind if kind in WHAT else None


def kind_of(path: str | os.PathLike, *, around: bool = False) -> str | None:
    """What `path` is: its marker's kind, else the kind whose files it holds, else None (not ours, or not a
    folder). `around`: `path` is a folder above or below the one a command writes, where a stray file must not
    make a folder "managed" (a downloaded ckpt.pt in a home directory, any meta.json): an unmarked out_dir is
    then known by a run's log beside its checkpoints (or its lock), a data folder by a meta.json that is a
    manifest; exports and sharded checkpoints by their files, which are specific enough."""
    path = Path(path)
    try:
        if not path.is_dir():
            return None
        marked = _marked(path)
        if marked:
            return marked
        if (path / DCP_METADATA).is_file():
            return CHECKPOINT
        if all((path / name).is_file() for name in EXPORT_NAMES):
            return EXPORT
        if (_is_manifest(path / DATA_MANIFEST) if around else (path / DATA_MANIFEST).is_file()) \
                or (path / DATA_LOCK).exists() \
                or any(p.name.startswith(DATA_BUILD_PREFIX) for p in path.glob(f"{DATA_BUILD_PREFIX}*.json")):
            return DATA  # (a manifest first: a folder that holds both is the mixed case, owned by its data)
        checkpoints = any((path / n).is_file() for n in (CKPT_NAME, BEST_NAME)) or \
            any((path / n).is_dir() for n in OUT_DIR_DIRS)
        if around:  # a run's log beside its checkpoints, or its lock: not one stray file
            ran = (path / "metrics.jsonl").is_file() and checkpoints or (path / ".train.lock").is_file()
            return OUT_DIR if ran else None
        if checkpoints or any((path / name).is_file() for name in OUT_DIR_FILES):
            return OUT_DIR
    except OSError:  # unreadable: nothing says it is ours
        return None
    return None


def _is_manifest(path: Path) -> bool:
    """A meta.json that python -m data.prepare wrote (its first keys), not any file of that name. Only its first
    MANIFEST_HEAD bytes are read: a prepare writes the tokenizer and vocab_size before its long lists (a manifest
    may be hundreds of MiB), and this is asked of every folder around an output."""
    try:  # a file of any size may be there: one over a manifest's size is none of ours, and is not read
        head = read_head(path, MANIFEST_HEAD, MANIFEST_MAX)
    except (OSError, TooLarge):
        return False
    return {"tokenizer", "vocab_size"} <= _first_keys(head, {"tokenizer", "vocab_size"})


_SPACE = re.compile(r"[ \t\n\r]*")


def _first_keys(head: bytes, wanted: set[str]) -> set[str]:
    """The keys of the JSON object `head` begins with (a file's first bytes), in order and as far as their values
    are whole in `head`, stopping once all of `wanted` are found; set() where `head` begins no JSON object."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:  # (a character the head's end cuts in two is the file's own: the keys before it)
        cut = e.reason == "unexpected end of data" and e.end == len(head)
        text = head[:e.start].decode("utf-8", "replace") if cut else ""
    decode, keys = json.JSONDecoder().raw_decode, set()
    at = _SPACE.match(text).end() + 1
    if text[at - 1:at] != "{":
        return keys
    try:
        while not wanted <= keys:
            key, at = decode(text, _SPACE.match(text, at).end())
            at = _SPACE.match(text, at).end()
            if not isinstance(key, str) or text[at:at + 1] != ":":
                break
            _, at = decode(text, _SPACE.match(text, at + 1).end())  # (its value: whole, or no key counted)
            keys.add(key)
            at = _SPACE.match(text, at).end()
            if text[at:at + 1] != ",":
                break
            at += 1
    except (ValueError, RecursionError):  # not JSON, or a value the head cuts
        pass
    return keys


def unmark_if_unused(path: str | os.PathLike, had: Iterable[str] = ()) -> None:
    """Remove `path`'s out_dir marker where the run that claimed it stopped before writing anything (refused
    at start): else the stray marker would make a later run refuse this folder, for a hidden reason. `had`: the
    names the folder held before the claim (a user's files the run refused to write over), none of them the
    marker: the marker is the claim's own."""
    path, had = Path(path), set(had)
    try:
        left = {p.name for p in path.iterdir()} - {MARKER, ".train.lock"} - had
        if not left and MARKER not in had and _marked(path) == OUT_DIR:
            (path / MARKER).unlink()
    except OSError:
        pass


def check_output(path: str | os.PathLike, option: str, *, kind: str | None = None,
                 reading: Iterable[str | os.PathLike] = (), home: str | os.PathLike | None = None) -> Path:
    """The gate (see the module's docstring): `path`, from the option or config key `option`, checked as a
    value, then as a place to write (check_target); returns it as a Path, ~ expanded."""
    out = check_path_value(path, option)
    check_target(out, kind, option, reading=reading, home=home)
    return out


def check_target(path: str | os.PathLike, kind: str, option: str, *, reading: Iterable[str | os.PathLike] = (),
                 home: str | os.PathLike | None = None) -> None:
    """Refuse, in one UserError line naming both folders and the fix, a command about to write its `kind`
    folder `path` (chosen by the setting `option`) where it would mix with another: `path` is a managed
    folder of another kind, lies inside a managed folder, holds one (other than its own parts), or is, holds
    or lies inside a folder the command reads (`reading`). kind None: `path` is a single file; it may lie in
    the managed folder `home` (consolidate's output beside the checkpoint it reads), in no other."""
    check_path_value(path, option)
    if kind is not None:  # its own files are never links: said now, not at the first save
        check_no_links(path, OWN_NAMES[kind])
    given, path = path, _absolute(path)
    shown = str(path) if os.path.expanduser(given) == str(path) else f"{given}, that is {path}"  # (a link: both)
    mine = f"{WHAT[kind] if kind is not None else 'the output'} {shown} (from {option})"
    found = kind_of(path)
    if found is not None and found != kind:
        raise UserError(f"{path} (from {option}) is {WHAT[found]} (written by {OWNER[found]})"
                        f"{', not ' + WHAT[kind] if kind is not None else ''}; {_fix(kind, option)}: a folder has one "
                        "owner")
    home = _absolute(home) if home is not None else None
    if kind is None and home is not None and path.parent == home and path.name in (*OUT_DIR_NAMES, MARKER):
        raise UserError(f"{mine} is a name {OWNER[OUT_DIR]} writes in its out_dir {home}; {_fix(kind, option)}: "
                        f"a folder has one owner")
    for parent in path.parents:
        found = kind_of(parent, around=True)
        if found is None or parent == home:
            continue
        if parent == path.parent and kind in OWN_PARTS.get(found, ()):
            continue
        raise UserError(f"{mine} would lie inside {parent}, {WHAT[found]} (written by {OWNER[found]}); "
                        f"{_fix(kind, option, 'outside it')}: a folder has one owner")
    if kind is not None:
        for inner, found in _managed_below(path):
            if inner.parent == path and found in OWN_PARTS.get(kind, ()):
                continue
            raise UserError(f"{mine} holds {inner}, {WHAT[found]} (written by {OWNER[found]}); move {inner} out of "
                            f"it, or {_fix(kind, option)}: a folder has one owner")
    for read in reading:
        if not os.path.lexists(read):  # a hub name, not a path: nothing on disk to overwrite
            continue
        read = _absolute(read)
        if read == path or read in path.parents or path in read.parents:
            how = "is" if read == path else "lies inside" if read in path.parents else "holds"
            raise UserError(f"{mine} {how} {read}, which this command reads; {_fix(kind, option, 'apart from it')}")


def check_replaceable(folder: str | os.PathLike, names: Iterable[str], option: str, *,
                      new: dict[str, bytes] | None = None) -> None:
    """Refuse, in one UserError line naming the file and the fix, a command about to write the files `names`
    (names it picks itself) into `folder`, a folder of the user's, where one of them already holds a regular file
    that is neither one it wrote there (WRITTEN records its size and sha256; unchanged since) nor the very bytes it
    would write now (`new`). Checked before anything is written: a user's file is never replaced by a name the
    command chose. A managed folder is its owner's (its own names, check_target), and is not asked here."""
    folder = Path(folder)
    if kind_of(folder) is not None:
        return
    check_no_links(folder, (WRITTEN,))  # the record is the project's own file (class 1)
    try:
        record = _written(folder)
    except TooLarge:
        raise UserError(f"{option} {folder} holds {WRITTEN}, this project's record of the files it wrote there, and "
                        f"it is too large (over {WRITTEN_MAX >> 20} MiB: too many files of its own in one folder); "
                        f"remove it (the files it listed are then refused as the user's: move them away too), or "
                        f"choose another {option}") from None
    if record is None:
        raise UserError(f"{option} {folder} already holds {WRITTEN}, which is not a record this project wrote; move it "
                        f"away, or choose another {option}")
    for name in names:
        path = folder / name
        try:
            st = os.stat(path)  # through a link: the file a write would replace
        except OSError:  # a new name (or a loop: output_target says so)
            continue
        if not stat.S_ISREG(st.st_mode):  # a device, a FIFO: written into, nothing replaced; else output_target's line
            continue
        mine = [s for s in (record.get(name), _digest_of(new[name]) if new and name in new else None) if s]
        try:
            if any(size == st.st_size for size, _ in mine) and _digest(path) in {d for _, d in mine}:
                continue
        except OSError:  # unreadable: not known to be its own
            pass
        raise UserError(f"{option} {folder} already holds {name}, a file this command did not write there (or one "
                        f"changed since); it is never overwritten: move it away, or choose another {option}")


def record_written(folder: str | os.PathLike, names: Iterable[str], option: str = "--out", *,
                   create: bool = True) -> None:
    """Note in `folder`'s WRITTEN the regular files `names` just written there (check_replaceable's record), each
    right after it is written (a run that fails at its third file has its first two recorded: the rerun replaces
    them). Entries whose file is gone, or is no longer a regular file of the recorded size, are dropped (not its
    own any more), so the record stays as large as what is there. `create` False: only a folder that has a record
    already (a file the user named, written where a record lists its name). A failure to write the record (a full
    disk) is one UserError line."""
    folder = Path(folder)
    if kind_of(folder) is not None or not create and not os.path.lexists(folder / WRITTEN):
        return
    try:
        record = _written(folder)
    except TooLarge:  # check_replaceable says so at the next run that picks a name here
        return
    if record is None:  # not ours (check_replaceable refused it before anything was written): left as it is
        return
    names = set(names)
    for name in [n for n in record if n not in names]:
        try:
            st = os.stat(folder / name)
            if stat.S_ISREG(st.st_mode) and st.st_size == record[name][0]:
                continue
        except (OSError, ValueError):
            pass
        del record[name]
    for name in names:
        try:
            st = os.stat(folder / name)
            if stat.S_ISREG(st.st_mode):
                record[name] = (st.st_size, _digest(folder / name))
                continue
        except OSError:
            pass
        record.pop(name, None)
    try:
        atomic_write_bytes(folder / WRITTEN, (json.dumps({"written": record}, separators=(",", ":")) + "\n").encode())
    except OSError as e:
        raise UserError(f"wrote {', '.join(sorted(names))} in {option} {folder}, but cannot update {WRITTEN} there, "
                        f"its record ({short_error(e)}); {write_fix(e, f'choose another {option}')}, then move "
                        f"{'it' if len(names) == 1 else 'them'} away and rerun (an unrecorded file is never "
                        "replaced)") from None


def _written(folder: Path) -> dict[str, tuple[int, str]] | None:
    """The record WRITTEN in `folder`: {} where there is none; None where a file at its name is no record of ours
    (damaged, unreadable: a user's, never replaced). One over WRITTEN_MAX raises TooLarge (check_replaceable
    says so, and how to fix it)."""
    if not os.path.lexists(folder / WRITTEN):
        return {}
    try:
        info = json_loads(read_at_most(folder / WRITTEN, WRITTEN_MAX))
        return {name: (int(size), str(digest)) for name, (size, digest) in info["written"].items()}
    except TooLarge:
        raise
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _digest_of(data: bytes) -> tuple[int, str]:
    return len(data), hashlib.sha256(data).hexdigest()


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_parent(folder: str | os.PathLike, kind: str, option: str) -> None:
    """Refuse, in one UserError line, making `kind` folders in `folder` (data.root: each prepared folder goes
    in it) when `folder` is, or lies inside, a managed folder: they would lie inside that one. Checked before
    `folder` is created."""
    folder = _absolute(folder)
    for p in (folder, *folder.parents):
        found = kind_of(p, around=p != folder)
        if found is not None:
            where = "is" if p == folder else "lies inside"
            raise UserError(f"{option}={folder} {where} {p}, {WHAT[found]} (written by {OWNER[found]}), so "
                            f"{WHAT[kind]} made there would lie inside it; {_fix(kind, option, 'outside it')}: "
                            f"a folder has one owner")


def _fix(kind: str | None, option: str, where: str = "") -> str:
    if kind == DATA:
        return f"set {option} to {'a' if where else 'another'} directory{' ' + where if where else ''}"
    article = "an" if option.startswith("-") else "a"
    return f"choose {article} {option} {where}" if where else f"choose another {option}"


def _absolute(path: str | os.PathLike) -> Path:
    # resolved: a folder reached through a link is the folder itself
    return Path(os.path.realpath(os.path.expanduser(path)))


def _managed_below(path: Path) -> Iterable[tuple[Path, str]]:
    """The managed folders under `path` (not looking inside them), top-down, at most SCAN_DIRS folders."""
    try:
        if not path.is_dir():
            return
    except OSError:  # (a name too long: check_path_value said so first; anything else: nothing to look into)
        return
    seen = 0
    for top, dirs, _ in os.walk(path, onerror=lambda e: None):
        keep = []
        for name in sorted(dirs):
            inner = Path(top) / name
            if inner.is_symlink():
                continue
            found = kind_of(inner, around=True)
            if found is not None:
                yield inner, found
            else:
                keep.append(name)
        dirs[:] = keep
        seen += 1
        if seen >= SCAN_DIRS:
            return
