"""Text sources: tiny shakespeare, local files (text, JSON Lines, parquet, plain or .gz/.zst) and HF
datasets (from the hub or saved with `save_to_disk`), each streamed as pieces of documents.

A source yields `Piece`s. `new_doc` marks the first piece of a document and carries `pos`, the point
from which `read(pos)` starts again at that document (what a resumed prepare continues from).
`advance` is how far the progress bar moves (bytes for files, rows for HF datasets). `split` is 0
(train) or 1 (val) where the source decides it (the tail of a single text file, a separate val
source), None where the builder decides by a hash of the document. Long documents come in pieces of
about CHUNK_CHARS characters so that memory stays bounded whatever the corpus size.
"""
from __future__ import annotations

import codecs
import functools
import glob
import hashlib
import io
import json
import lzma
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from errors import UserError, short_error
from fileio import atomic_write_bytes
from network import hub_offline_unless_reachable

from .config import HF_PREFIX, SHAKESPEARE, DataConfig

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_ENV = "SMALLGPT_SHAKESPEARE"
SHAKESPEARE_MAX_BYTES = 4 << 20

CHUNK_CHARS = 1 << 20  # characters per piece handed to the tokenizer
READ_BYTES = 1 << 20
HF_ROWS_PER_READ = 1000
# JSON Lines are read a line at a time with the json module, not pyarrow: pyarrow's streaming JSON reader
# held 60-70 MB above its 25 MB import whatever the block size (a 128 MB corpus: the whole prepare peaked at
# 181 MB PSS, against 103 MB line by line, and ran no faster: json's C scanner parses ~150 MB/s on one
# core, 30x what tiktoken encodes). A row is one document; one over this bound is refused, not read.
ROW_MAX_BYTES = 128 << 20
PARQUET_ROWS = 4096
JSON_ARRAY_MAX = 1 << 30  # a .json file holding one array is parsed whole: refuse larger ones

ROW_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
COMPRESSED = {".gz": "gzip", ".zst": "zstd"}
# what a damaged compressed file is checked with (named in read_error's fix)
TESTERS = {"gzip": "gzip -t", "zstd": "zstd -t"}
# compressions and archives that are not read: refused by name, never read as (garbled) text
NOT_READ = {".bz2": "bzip2-compressed", ".xz": "xz-compressed", ".lzma": "lzma-compressed", ".lz4": "lz4-compressed",
            ".br": "brotli-compressed", ".zip": "a zip archive", ".7z": "a 7z archive", ".tar": "a tar archive",
            ".tgz": "a tar archive"}
# the first bytes of compressed data, to name it when a file so named is not UTF-8 text
MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"PK\x03\x04": "zip"}
# what reading a file raises when the file (or its compressed data, or its disk) is damaged or cut short:
# the decompressors' errors (pyarrow's are OSError or ArrowException), and the standard library's
READ_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)
FOLDER_SUFFIXES = (".txt", *ROW_SUFFIXES, *PARQUET_SUFFIXES)  # what a folder source takes


class Piece(NamedTuple):
    new_doc: bool
    text: str
    advance: int
    pos: Any = None  # on a document's first piece: where read() starts again at this document
    split: int | None = None  # 0 train, 1 val, None: by the document's hash


@dataclass
class Source:
    slug: str  # readable, filesystem-safe name for the prepared dir
    identity: dict[str, Any]  # what the fingerprint covers: changes here mean the data changed
    total: int | None  # progress-bar total, None when unknown (streaming)
    unit: str  # progress-bar unit
    read: Callable[[Any], Iterator[Piece]]  # read(None) from the start, read(pos) from a document's pos
    files: list[Path] | None = None  # local files: their CONTENT joins the identity (see build._fingerprint)
    skipped: list = field(default_factory=list)  # bad rows skipped (data.skip_bad_rows): (file, row, why)

    def pieces(self) -> Iterator[Piece]:
        return self.read(None)


def open_source(cfg: DataConfig, spec: str | None = None, *, tail_split: bool = True) -> Source:
    """Resolve `spec` (default cfg.dataset) to a Source, raising UserError for anything missing or
    unusable. A single text file (tiny shakespeare too) is one document, so its val split is its tail:
    the last val_fraction of its bytes, cut where the tokens come out as for the whole text
    (`tail_split`); every other source is split by document, by the builder."""
    spec = cfg.dataset if spec is None else spec
    tail = cfg.val_fraction if tail_split else None
    if spec == SHAKESPEARE:
        path = shakespeare_path(cfg.local_path)
        return Source(
            slug=SHAKESPEARE,
            identity={"kind": SHAKESPEARE, "sha256": SHAKESPEARE_SHA256},
            total=path.stat().st_size,
            unit="B",
            read=lambda pos: _files_pieces([path], cfg, pos, tail),
        )
    if spec.startswith(HF_PREFIX):
        name = spec[len(HF_PREFIX):]
        if _looks_local(name) and Path(name).expanduser().exists():  # hf:/path/to/dir: a local source
            return _local_source(name, cfg, tail)
        return _hf_source(cfg, name)
    return _local_source(spec, cfg, tail)


# --- text splitting -------------------------------------------------------------------------------

# Places where cutting a text in two gives the same tokens as encoding it whole: after a newline, or
# before a space, that sits between two non-whitespace characters. In the pre-tokenizer regexes of
# gpt2 (tested), cl100k_base and o200k_base (by reading their patterns) no piece crosses such a place
# and no lookahead reaches past it, and BPE never merges across pieces.
_CUT_AFTER_NEWLINE = re.compile(r"(?<=\S)\n(?=\S)")
_CUT_BEFORE_SPACE = re.compile(r"(?<=\S) (?=\S)")


def _cut_point(text: str, limit: int) -> int:
    """Where to cut `text` so the first part is at most `limit` characters and tokenizes unchanged."""
    lo = limit // 2  # don't make tiny pieces: look for a cut in the second half only
    for pattern, use_end in ((_CUT_AFTER_NEWLINE, True), (_CUT_BEFORE_SPACE, False)):
        last = None
        for last in pattern.finditer(text, lo, limit):
            pass
        if last is not None:
            return last.end() if use_end else last.start()
    # No newline or space for limit/2 characters (not prose): cut anyway, which may change the
    # tokens at this one seam but keeps memory bounded.
    return limit


def _first_cut_after(text: str, start: int) -> int:
    """The first safe cut point at or after `start`; else the last one before it (a short text); else `start`
    itself (no space or newline at all: the tokens may change at this one seam)."""
    cuts = [m.end() if p is _CUT_AFTER_NEWLINE else m.start()
            for p in (_CUT_AFTER_NEWLINE, _CUT_BEFORE_SPACE) for m in p.finditer(text)]
    after = [c for c in cuts if c >= start]
    return min(after) if after else max(cuts, default=start)


def _split_off(text: str) -> tuple[list[str], str]:
    """Cut pieces of at most CHUNK_CHARS off the front of `text` while it is longer; return them and the rest."""
    pieces = []
    while len(text) > CHUNK_CHARS:
        cut = _cut_point(text, CHUNK_CHARS)
        pieces.append(text[:cut])
        text = text[cut:]
    return pieces, text


def _doc_pieces(text: str, advance: int, pos: Any, split: int | None) -> Iterator[Piece]:
    parts, rest = _split_off(text)
    for i, part in enumerate(parts + [rest]):
        yield Piece(i == 0, part, advance if i == 0 else 0, pos if i == 0 else None, split)


# --- local files ----------------------------------------------------------------------------------


def _kind(path: Path) -> tuple[str, str | None]:
    """("text" | "rows" | "parquet", compression or None) from the file name."""
    name = path.name.lower()
    compression = next((c for s, c in COMPRESSED.items() if name.endswith(s)), None)
    if compression:
        name = name[: name.rfind(".")]
    if name.endswith(ROW_SUFFIXES):
        return "rows", compression
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet", compression
    return "text", compression


def _open_bytes(path: Path, compression: str | None):
    if compression is None:
        return open(path, "rb")
    import pyarrow as pa  # decompresses gzip and zstd streams, so no extra package is needed

    try:  # buffered: readline(limit) for JSON Lines, which pyarrow's stream lacks
        return io.BufferedReader(pa.input_stream(str(path), compression=compression))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot open {path} as {compression} ({e}); check the file") from None


def _files_pieces(paths: list[Path], cfg: DataConfig, pos: Any, tail: float | None, source: Source | None = None) -> Iterator[Piece]:
    """The documents of `paths` from position `pos` = [file index, row] on. With `tail` (a single text
    file), the last `tail` of its bytes are val."""
    start_file, start_row = pos if pos is not None else (0, 0)
    for index in range(start_file, len(paths)):
        path = paths[index]
        compression = _kind(path)[1]
        try:
            yield from _file_pieces(path, index, start_row if index == start_file else 0, cfg, tail, source)
        except Exception as e:
            # Raised while reading, a read error is the SOURCE's: the build would blame the disk it writes to.
            # Any other (a UserError, a bug) goes on up as it is.
            if not is_read_error(e):
                raise
            raise read_error(path, e, compression) from None


def _file_pieces(path: Path, index: int, first: int, cfg: DataConfig, tail: float | None,
                 source: Source | None) -> Iterator[Piece]:
    kind, compression = _kind(path)
    if kind == "text":
        cut = path.stat().st_size - int(path.stat().st_size * tail) if tail is not None and compression is None else None
        yield from _text_pieces(path, compression, [index, 0], cut)
    else:
        reader = _rows_pieces if kind == "rows" else _parquet_pieces
        moved = [0]  # bytes of this file the progress bar has been moved by so far
        yield from reader(path, compression, index, first, cfg, source, moved)
        yield Piece(False, "", max(0, path.stat().st_size - moved[0]), None, None)  # the rest of the file


def is_read_error(e: BaseException) -> bool:
    """Whether `e`, raised while reading a file, means the file could not be read (READ_ERRORS, or one of
    pyarrow's errors: its decompressors and parquet reader raise ArrowException as well as OSError)."""
    return isinstance(e, READ_ERRORS) or any(c.__name__ == "ArrowException" for c in type(e).__mro__)


def read_error(path: Path, e: BaseException, compression: str | None = None) -> UserError:
    """The one-line error for a source file that reading failed on: the file's problem and its fix. Not the
    prepared data's disk (a failed write says that), and not "free some space", which would not help."""
    why = short_error(e)
    if isinstance(e, PermissionError):
        return UserError(f"cannot read {path} ({why}); fix its permissions, or leave it out of data.dataset")
    if isinstance(e, FileNotFoundError):
        return UserError(f"{path} went away while it was read ({why}); put it back, or leave it out of data.dataset")
    if compression:
        return UserError(f"{path} is damaged: its {compression} data is cut short or corrupt ({why}); download it "
                         f"or compress it again from the original (`{TESTERS[compression]} {path}` checks it)")
    return UserError(f"cannot read {path} ({why}): the file (or its disk) is damaged; copy or download it again, "
                     f"or leave it out of data.dataset")


def _text_pieces(path: Path, compression: str | None, pos: list, cut_byte: int | None) -> Iterator[Piece]:
    """The file is one document, decoded as UTF-8 incrementally and cut into pieces. With `cut_byte`,
    the pieces from the first safe cut point at or after that byte on are val (split 1)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending, new_doc, offset, emitted = "", True, 0, 0
    split = None if cut_byte is None else 0

    def emit(text: str) -> Iterator[Piece]:
        nonlocal new_doc, emitted, split
        if split == 0:
            raw = text.encode("utf-8")
            if emitted + len(raw) > cut_byte:
                at = _first_cut_after(text, len(raw[: cut_byte - emitted].decode("utf-8", errors="ignore")))
                if at > 0:
                    yield Piece(new_doc, text[:at], 0, pos if new_doc else None, 0)
                    new_doc = False
                text, split = text[at:], 1
            emitted += len(raw)
        yield Piece(new_doc, text, 0, pos if new_doc else None, split)
        new_doc = False

    with _open_bytes(path, compression) as f:
        while True:
            raw = f.read(READ_BYTES)
            try:
                pending += decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                raise _misnamed(path, compression) or UserError(
                    f"{path} is not UTF-8 text (bad byte near offset {offset + e.start}); convert it to UTF-8 "
                    f"(e.g. iconv -t UTF-8) or leave it out of data.dataset"
                ) from None
            offset += len(raw)
            # Keep the tail (the next read may continue it); emit the pieces before it.
            pieces, pending = _split_off(pending)
            for piece in pieces:
                yield from emit(piece)
            if not raw:
                break
            yield Piece(False, "", len(raw), None, split)  # progress only
    yield from emit(pending)


def _misnamed(path: Path, compression: str | None) -> UserError | None:
    """The error for compressed data in a file not named for it ("converting it to UTF-8" would be the
    wrong fix), or None when it does not start like compressed data."""
    if compression:
        return None
    with open(path, "rb") as f:
        head = f.read(8)
    fmt = next((name for magic, name in MAGIC.items() if head.startswith(magic)), None)
    if fmt is None:
        return None
    suffix = next((s for s, c in COMPRESSED.items() if c == fmt), None)
    fix = f"name it with {suffix} at the end (it is read as it is)" if suffix else "decompress it"
    return UserError(f"{path} holds {fmt}-compressed data, not text; {fix}, or leave it out of data.dataset")


def _bad_row(path: Path, row: int, why: str, source: Source | None, cfg: DataConfig) -> None:
    """Raise the one-line error for a bad row, or count it when data.skip_bad_rows is set."""
    if cfg.skip_bad_rows and source is not None:
        source.skipped.append([str(path), row, why])
        return
    raise UserError(f"{path}, row {row}: {why}; fix that row, or set data.skip_bad_rows: true to skip bad rows "
                    f"(they are counted)")


def _why(value: Any, fld: str, present: bool) -> str:
    if not present or value is None:
        return f"it has no {fld!r} field (set data.text_field to the field holding the text)"
    return f"its {fld!r} field is a {type(value).__name__}, not text"


def _rows_pieces(path: Path, compression: str | None, index: int, first: int, cfg: DataConfig,
                 source: Source | None, moved: list[int]) -> Iterator[Piece]:
    """A JSON Lines file (or a .json file holding one array of objects): one document per row, the
    text in cfg.text_field. Each line is parsed by the standard library's json (its C scanner), which
    names a bad row's line directly and holds one row at a time; see ROW_MAX_BYTES for why not pyarrow."""
    with _open_bytes(path, compression) as f:
        head = f.read(64).lstrip()
    if head.startswith(b"["):
        yield from _json_array_pieces(path, compression, index, first, cfg, source)
        return
    fld = cfg.text_field
    row, line_no, unreported = 0, 0, 0
    with _open_bytes(path, compression) as f:
        while line := f.readline(ROW_MAX_BYTES + 1):
            line_no += 1
            unreported += len(line)
            if compression is None and unreported >= READ_BYTES:  # progress, in the file's own bytes
                moved[0] += unreported
                yield Piece(False, "", unreported, None, None)
                unreported = 0
            if len(line) > ROW_MAX_BYTES and not line.endswith(b"\n"):
                raise UserError(f"{path}, row {line_no}: it is over {ROW_MAX_BYTES:,} bytes on one line, too big to "
                                f"read as one document; split that document into several rows")
            if not line.strip():
                continue
            row += 1
            if row <= first:
                continue
            try:
                obj = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as e:
                _bad_row(path, line_no, f"it is not UTF-8 (bad byte at column {e.start + 1})", source, cfg)
                continue
            except ValueError as e:
                _bad_row(path, line_no, f"it is not valid JSON ({e})", source, cfg)
                continue
            if not isinstance(obj, dict):
                _bad_row(path, line_no, f"it is a JSON {type(obj).__name__}, not an object", source, cfg)
                continue
            value = obj.get(fld)
            if not isinstance(value, str):
                _bad_row(path, line_no, _why(value, fld, fld in obj), source, cfg)
                continue
            yield from _doc_pieces(value, 0, [index, row - 1], None)


def _json_array_pieces(path: Path, compression: str | None, index: int, first: int, cfg: DataConfig,
                       source: Source | None) -> Iterator[Piece]:
    if compression is None and path.stat().st_size > JSON_ARRAY_MAX:
        raise UserError(f"{path} is one JSON array of {path.stat().st_size >> 20} MB, too big to read at once; "
                        f"convert it to JSON Lines (one object per line, e.g. jq -c '.[]')")
    with _open_bytes(path, compression) as f:
        raw = f.read(JSON_ARRAY_MAX + 1)
    try:
        rows = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); fix it, or write it as JSON Lines") from None
    fld = cfg.text_field
    for i, obj in enumerate(rows[first:], first):
        value = obj.get(fld) if isinstance(obj, dict) else None
        if not isinstance(value, str):
            _bad_row(path, i + 1, _why(value, fld, isinstance(obj, dict) and fld in obj), source, cfg)
            continue
        yield from _doc_pieces(value, 0, [index, i], None)


def _parquet_pieces(path: Path, compression: str | None, index: int, first: int, cfg: DataConfig,
                    source: Source | None, moved: list[int]) -> Iterator[Piece]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if compression:
        raise UserError(f"{path} is a compressed parquet file; parquet compresses inside the file: decompress it "
                        f"(e.g. gunzip or zstd -d) and name the .parquet file")
    fld = cfg.text_field
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path} is not a readable parquet file ({e}); check the file") from None
    names = pf.schema_arrow.names
    if fld not in names:
        raise UserError(f"{path} has no column {fld!r} (columns: {', '.join(names)}); set data.text_field to the "
                        f"one holding the text")
    col_type = pf.schema_arrow.field(fld).type
    if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
        raise UserError(f"{path}'s column {fld!r} holds {col_type}, not text; set data.text_field to a text column")
    done = 0
    groups = []
    for g in range(pf.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if done + n > first:
            groups.append(g)
        else:
            done += n
    if not groups:
        return
    for batch in pf.iter_batches(batch_size=PARQUET_ROWS, row_groups=groups, columns=[fld]):
        column = batch.column(0)
        try:
            texts = column.to_pylist()
        except UnicodeDecodeError:
            texts = []
            for i in range(len(column)):
                try:
                    texts.append(column[i].as_py())
                except UnicodeDecodeError:
                    texts.append(b"")  # marks a bad row below
        for i, text in enumerate(texts):
            row = done + i
            if row < first:
                continue
            if not isinstance(text, str):
                why = "its text is not UTF-8" if text == b"" else _why(text, fld, True)
                _bad_row(path, row + 1, why, source, cfg)
                continue
            yield from _doc_pieces(text, 0, [index, row], None)
        done += len(texts)
        step = path.stat().st_size * len(texts) // max(pf.metadata.num_rows, 1)  # progress: the rows' share
        moved[0] += step
        yield Piece(False, "", step, None, None)


_GLOB_CHARS = re.compile(r"[*?\[]")


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_dict.json").is_file()
                              or ((path / "state.json").is_file() and (path / "dataset_info.json").is_file()))


def _looks_local(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or os.sep in name.strip("/").replace("/", "", 1) or Path(name).exists()


def _local_source(spec: str, cfg: DataConfig, tail: float | None) -> Source:
    path = Path(spec).expanduser()
    if _is_saved_dataset(path):
        return _hf_source(cfg, str(path), saved=True)
    if _GLOB_CHARS.search(spec) and not path.exists():  # a file or dir named with "[" is itself, not a pattern
        paths = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True) if os.path.isfile(p))
        if not paths:
            raise UserError(f"no files match data.dataset {spec!r}; check the pattern (use ** for subdirectories)")
        name = Path(_GLOB_CHARS.split(spec)[0]).name or "glob"  # the fixed part before the pattern
    elif path.is_file():
        paths, name = [path], path.name.split(".")[0] or path.stem
    elif path.is_dir():
        paths = sorted(p for p in path.rglob("*") if p.is_file() and _takes(p))
        if not paths:
            raise UserError(
                f"no .txt, .jsonl, .json or .parquet files (plain, .gz or .zst) under {spec}; add some, or name other "
                f"files with a glob such as '{spec.rstrip('/')}/**/*.md'"
            )
        name = path.resolve().name
    elif path.exists():  # a fifo, a socket, a device
        raise UserError(f"data.dataset {spec!r} is neither a file nor a directory; give a regular file, directory or glob")
    else:
        raise UserError(
            f"data.dataset {spec!r} does not exist; give an existing file (.txt, .jsonl, .json, .parquet, "
            f"optionally .gz/.zst), directory or glob, '{SHAKESPEARE}', or 'hf:<name>'"
        )
    for p in paths:
        _check_readable_kind(p)
    # One text file is one document: its val split is its tail. Anything else is split by document.
    single_text = len(paths) == 1 and _kind(paths[0]) == ("text", None)
    # The files' content identifies them (hashed by build._fingerprint, which reuses a stored hash while a
    # file's size and mtime are unchanged): touching a file is no change, editing one is.
    where = hashlib.sha256(os.path.abspath(os.path.expanduser(spec)).encode()).hexdigest()[:8]
    kinds = sorted({_kind(p)[0] for p in paths})
    identity = {"kind": "files", "field": cfg.text_field if kinds != ["text"] else None,
                "skip_bad_rows": cfg.skip_bad_rows if kinds != ["text"] else None}
    source = Source(
        slug=f"{_safe(name)}-{where}",  # the hash keeps two different 'input.txt's apart
        identity=identity,
        total=sum(p.stat().st_size for p in paths),
        unit="B",
        read=lambda pos: _files_pieces(paths, cfg, pos, tail if single_text else None, source),
        files=paths,
    )
    return source


def _check_readable_kind(path: Path) -> None:
    """Refuse a file compressed (or archived) in a way this code does not read: read as text it would be
    garbage, and "convert it to UTF-8" the wrong fix."""
    suffix = next((s for s in NOT_READ if path.name.lower().endswith(s)), None)
    if suffix:
        raise UserError(f"{path} is {NOT_READ[suffix]}, which data.dataset does not read; decompress or extract it "
                        f"(.gz and .zst files are read as they are)")


def _takes(path: Path) -> bool:
    name = path.name.lower()
    for suffix in COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name.endswith(FOLDER_SUFFIXES) and not path.name.startswith(".")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", name).strip("-.") or "data"


# --- tiny shakespeare -----------------------------------------------------------------------------


def shakespeare_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "smallgpt" / "tinyshakespeare" / "input.txt"


def _sha256(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except READ_ERRORS as e:
        raise read_error(path, e) from None


def shakespeare_path(local_path: str = "") -> Path:
    """The verified tiny shakespeare file: data.local_path, else $SMALLGPT_SHAKESPEARE, else the cache,
    downloading it there on first use."""
    for given, what in ((local_path, "data.local_path"), (os.environ.get(SHAKESPEARE_ENV, ""), SHAKESPEARE_ENV)):
        if given:
            path = Path(given).expanduser()
            if path.is_dir():
                raise UserError(f"{what} points at {given}, which is a directory; point it at tiny shakespeare's "
                                f"input.txt (the file itself) or unset {what}")
            if not path.is_file():
                raise UserError(f"{what} points at {given}, which "
                                f"{'is not a regular file' if path.exists() else 'does not exist'}; fix the path or unset {what}")
            if _sha256(path) != SHAKESPEARE_SHA256:
                raise UserError(
                    f"{path} (from {what}) is not tiny shakespeare (sha256 differs); point {what} at the original "
                    f"file, or use your edited copy as a local source: data.dataset: {path}"
                )
            return path
    cached = shakespeare_cache_path()
    if cached.is_file() and _sha256(cached) == SHAKESPEARE_SHA256:
        return cached
    _download_shakespeare(cached)
    return cached


def _download_shakespeare(dest: Path) -> None:
    import urllib.error  # only here: urllib.request brings http, email and ssl (~7 MB) to every prepare
    import urllib.request

    fix = f"download {SHAKESPEARE_URL} yourself and save it as {dest}, or set {SHAKESPEARE_ENV} to a copy"
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=60) as r:
            body = r.read(SHAKESPEARE_MAX_BYTES)  # bounded: the file is 1.1 MB; anything else fails the sha256
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(f"could not download tiny shakespeare ({reason}); {fix}") from None
    if hashlib.sha256(body).hexdigest() != SHAKESPEARE_SHA256:
        raise UserError(f"the downloaded tiny shakespeare has the wrong sha256 (a proxy or a changed file?); {fix}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(dest, body)


# --- HF datasets ----------------------------------------------------------------------------------

# datasets' packaged builders: with no data_files they read the current directory, never what was meant
_BUILDERS = {"json", "csv", "parquet", "text", "arrow", "pandas", "webdataset", "imagefolder", "audiofolder",
             "videofolder", "sql", "xml", "generator"}


def _hub_url(name: str) -> str:
    """The dataset's hub page, only for names that look like a hub id (owner/name or name)."""
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", name) and not Path(name).exists():
        return f"; check the name, data.hf_subset and data.hf_split on https://huggingface.co/datasets/{name} and your network (or HF_DATASETS_OFFLINE)"
    return "; check the path, data.hf_subset and data.hf_split"


def _hf_source(cfg: DataConfig, name: str, saved: bool = False) -> Source:
    subset = cfg.hf_subset or None
    fld = cfg.text_field
    if not saved and name.lower() in _BUILDERS:
        raise UserError(f"'hf:{name}' names datasets' {name} builder, which would read the current directory; give "
                        f"the files themselves: data.dataset: path/to/*.jsonl (or a folder, or a .parquet file)")
    where = (f"dataset saved at {name}" if saved else f"HF dataset {name!r}" + (f" (subset {subset!r})" if subset else "")) \
        + f" split {cfg.hf_split!r}"

    @functools.cache
    def dataset():
        import datasets  # slow to import; only HF sources need it

        try:
            if saved:
                ds = datasets.load_from_disk(name)
                if isinstance(ds, datasets.DatasetDict):
                    if cfg.hf_split not in ds:
                        raise UserError(f"the dataset saved at {name} has no split {cfg.hf_split!r} (splits: "
                                        f"{', '.join(ds)}); set data.hf_split to one of them")
                    ds = ds[cfg.hf_split]
            else:
                hub_offline_unless_reachable()  # an unreachable hub: the cache or HF's quick offline error
                kwargs: dict[str, Any] = {"split": cfg.hf_split, "streaming": cfg.streaming}
                if cfg.num_proc > 1 and not cfg.streaming:
                    kwargs["num_proc"] = cfg.num_proc
                ds = datasets.load_dataset(name, subset, **kwargs)
        except UserError:
            raise
        except Exception as e:  # the hub, the network and the builders raise many types; all mean "can't load this"
            detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise UserError(f"could not load {where}: {detail}{_hub_url(name) if not saved else '; check the folder'}") from None
        columns = ds.column_names
        if columns is None:  # a streamed dataset may not know its features until the first row
            first = next(iter(ds), None)
            columns = list(first) if first is not None else [fld]
        if fld not in columns:
            raise UserError(
                f"{where} has no column {fld!r} (columns: {', '.join(map(str, columns))}); "
                f"set data.text_field to the one holding the text"
            )
        return ds.select_columns([fld])

    def read(pos: Any) -> Iterator[Piece]:
        try:
            yield from rows(pos)
        except UserError:
            raise
        except Exception as e:  # as when loading: many types, all "can't read this"; the build would blame data.root
            fix = ("check your network (a streamed dataset is read as it goes) and rerun" if cfg.streaming and not saved
                   else "its files may be damaged: " + ("save it again" if saved else "remove its copy in the HF "
                                                        "datasets cache and rerun to download it again"))
            raise UserError(f"could not read {where} ({short_error(e)}); {fix}") from None

    def rows(pos: Any) -> Iterator[Piece]:
        start = pos[1] if pos is not None else 0
        ds = dataset()
        if start:
            ds = ds.skip(start) if cfg.streaming and not saved else ds.select(range(start, len(ds)))
        row = start
        for batch in ds.iter(batch_size=HF_ROWS_PER_READ):
            for text in batch[fld]:
                row += 1
                if text is None:
                    yield Piece(True, "", 1, [0, row - 1], None)
                    continue
                if not isinstance(text, str):
                    if cfg.skip_bad_rows:
                        source.skipped.append([name, row, f"a {type(text).__name__} in column {fld!r}"])
                        continue
                    raise UserError(
                        f"row {row} of {where} has a {type(text).__name__} in column {fld!r}, not text; "
                        f"set data.text_field to a text column (or data.skip_bad_rows: true to skip such rows)"
                    )
                yield from _doc_pieces(text, 1, [0, row - 1], None)

    # A downloaded or saved dataset has a content fingerprint, so it is loaded now. A streamed one is
    # identified by name alone and opened only when it must be read: an up-to-date prepare needs no network.
    streaming = cfg.streaming and not saved
    content = None if streaming else getattr(dataset(), "_fingerprint", None)
    slug = ("saved-" + Path(name).resolve().name + "-" + hashlib.sha256(str(Path(name).resolve()).encode()).hexdigest()[:8]
            if saved else "hf-" + name.replace("/", "-") + (f"-{subset}" if subset else ""))
    source = Source(
        slug=_safe(f"{slug}-{cfg.hf_split}"),
        identity={"kind": "saved" if saved else "hf", "name": name, "subset": subset, "split": cfg.hf_split,
                  "field": fld, "content": content, **({"skip_bad_rows": True} if cfg.skip_bad_rows else {})},
        total=None if streaming else len(dataset()),
        unit="doc",
        read=read,
    )
    return source
