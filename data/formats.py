"""Reading local source files, told apart by name: text (a file is one document), JSON Lines, a JSON array and
parquet (a document per row), each plain or .gz/.zst; and the one-line errors for a file that cannot be read."""
from __future__ import annotations

import codecs
import lzma
import re
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from bounded import read_stream
from errors import UserError, short_error
from fileio import json_loads

from .compressed import READ_BYTES, decompressed, decompressed_size, open_bytes
from .config import CHAT, DataConfig
from .messages import lone_surrogate, take_conversation
from .pieces import Piece, Source, doc_pieces, first_cut_after, split_off

# JSON Lines are read a line at a time with the json module, not pyarrow: pyarrow's streaming JSON reader
# held 60-70 MB above its 25 MB import whatever the block size (a 128 MB corpus: the whole prepare peaked at
# 181 MB PSS, against 103 MB line by line, and ran no faster: json's C scanner parses ~150 MB/s on one
# core, 30x what tiktoken encodes). A row is one document; one over this bound is refused, not read.
ROW_MAX_BYTES = 128 << 20
PARQUET_ROWS = 4096
# A parquet file's text is decoded by arithmetic first: a text column is read dictionary-encoded (a value used by
# 8192 rows is held once, not 8192 times) and each row's length taken from the dictionary before any string is
# made. A row over ROW_MAX_BYTES is refused, as in JSON Lines; rows become Python strings at most this many bytes
# at a time; and text past PARQUET_EXPANSION times the file's size (beyond one such slice) is no corpus but a
# decompression bomb (367 bytes of zstd and dictionary decoded to 8 GB), refused before it is decoded.
PARQUET_SLICE_BYTES, PARQUET_EXPANSION = 64 << 20, 1000
# A .json file holding one array is parsed whole (JSON Lines stream, a row at a time): its bytes are capped low, and
# so is what parsing one document (an array, or a row) may cost in memory, estimated before parsing (parse_cost):
# 1 GiB of "[{},{},...]" took 30 GB, and one 127 MB row of '{"messages":[{},{},...]}' 3.6 GB, before their errors.
JSON_ARRAY_MAX, PARSE_MAX = 64 << 20, 1 << 30


def parse_cost(raw: bytes) -> int:
    """An upper estimate of the memory json.loads takes for `raw`, counted at C speed before it is parsed: the text
    (decoded, up to 4 bytes a character), ~120 bytes for each object or array (an empty dict is 64, with its GC
    header and its slot in its parent ~90: measured), ~60 for each string (a quote is half of one) and ~40 for each
    comma (an element or member: its slot and, a number, its object: 1e5 as an int is 28 bytes, as a float 24; a
    million of them took 2.3x the estimate without this term). Brackets, quotes and commas inside strings count
    too: an overestimate, by at most a few times the text's size."""
    return (4 * len(raw) + 120 * (raw.count(b"{") + raw.count(b"[")) + 30 * raw.count(b'"')
            + 40 * raw.count(b","))


def check_parse_cost(raw: bytes, where: str, fix: str) -> None:
    cost = parse_cost(raw)
    if cost > PARSE_MAX:
        raise UserError(f"{where}: parsing its {len(raw):,} bytes of JSON would take ~{cost >> 20:,} MiB of memory "
                        f"({raw.count(b'{') + raw.count(b'['):,} objects and arrays), over the {PARSE_MAX >> 20:,} MiB "
                        f"one document may; {fix}")

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


class RowKind(NamedTuple):
    """What a row of a jsonl, json, parquet or HF source becomes: `take(value of field, whether the row has the
    field, pos, advance)` gives its document's pieces (text: the field's text; chat: the checked conversation
    as one piece of JSON, messages.py) or, for a bad row, the one-line fault."""
    field: str
    take: Callable[[Any, bool, Any, int], Iterator[Piece] | str]
    chat: bool


def row_kind(cfg: DataConfig) -> RowKind:
    if cfg.format == CHAT:
        fld = cfg.messages_field
        return RowKind(fld, lambda value, present, pos, advance: take_conversation(value, present, pos, advance, fld),
                       True)
    fld = cfg.text_field

    def take(value: Any, present: bool, pos: Any, advance: int) -> Iterator[Piece] | str:
        at = lone_surrogate(value) if isinstance(value, str) else None
        if not isinstance(value, str) or at:
            return _why(value, fld, present, at)
        return doc_pieces(value, advance, pos, None)

    return RowKind(fld, take, False)


def file_kind(path: Path) -> tuple[str, str | None]:
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


BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark


def files_pieces(paths: list[Path], cfg: DataConfig, pos: Any, tail: float | None, source: Source | None = None) -> Iterator[Piece]:
    """The documents of `paths` from position `pos` = [file index, row] on. With `tail` (a single text
    file), the last `tail` of its bytes are val."""
    start_file, start_row = pos if pos is not None else (0, 0)
    for index in range(start_file, len(paths)):
        path = paths[index]
        compression = file_kind(path)[1]
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
    kind, compression = file_kind(path)
    if kind == "text":
        cut = None
        if tail is not None:  # the tail of the TEXT's bytes: a compressed file's own size is not that
            size = path.stat().st_size if compression is None else decompressed_size(path, compression)
            cut = size - int(size * tail)
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
    decoder = codecs.getincrementaldecoder("utf-8-sig")()  # a BOM (Windows' editors write one) is no text
    pending, new_doc, offset, emitted = "", True, 0, 0
    split = None if cut_byte is None else 0

    def emit(text: str) -> Iterator[Piece]:
        nonlocal new_doc, emitted, split
        if split == 0:
            raw = text.encode("utf-8")
            if emitted + len(raw) > cut_byte:
                at = first_cut_after(text, len(raw[: cut_byte - emitted].decode("utf-8", errors="ignore")))
                if at > 0:
                    yield Piece(new_doc, text[:at], 0, pos if new_doc else None, 0)
                    new_doc = False
                text, split = text[at:], 1
            emitted += len(raw)
        yield Piece(new_doc, text, 0, pos if new_doc else None, split)
        new_doc = False

    moved = 0  # the file's own bytes the progress bar has been moved by: its total is the file's size
    with open(path, "rb") as disk, decompressed(disk, path, compression) as f:
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
            pieces, pending = split_off(pending)
            for piece in pieces:
                yield from emit(piece)
            if not raw:
                break
            yield Piece(False, "", disk.tell() - moved, None, split)  # progress only (not len(raw): decompressed)
            moved = disk.tell()
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


# A text row's fault kind, read back from its text as messages.fault_kind does a conversation's (skipped rows
# are kept as text: in the resume record and the manifest). Anchored on the fixed words before any row value.
TEXT_FAULTS = [(kind, re.compile(pattern)) for kind, pattern in (
    ("no text field", r"it has no '.*' field \(set data\.text_field"),
    ("text field not text", r"its '.*' field (is an? \w+|is null|has a lone surrogate .*), not text"),
    ("not UTF-8", r"(it|its text) is not UTF-8"),
    ("not valid JSON", r"it is not valid JSON "),
    ("not a JSON object", r"it is a JSON \w+, not an object$"),
)]


def text_fault_kind(why: str) -> str:
    return next((kind for kind, pattern in TEXT_FAULTS if pattern.match(why)), "other")


def _why(value: Any, fld: str, present: bool, surrogate: str | None = None) -> str:
    if not present:
        return f"it has no {fld!r} field (set data.text_field to the field holding the text)"
    if value is None:
        return f"its {fld!r} field is null, not text"
    if surrogate:
        return (f"its {fld!r} field has a lone surrogate ({surrogate}), not text; write the character itself or a "
                "surrogate pair")
    kind = type(value).__name__
    return f"its {fld!r} field is {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not text"


def _rows_pieces(path: Path, compression: str | None, index: int, first: int, cfg: DataConfig,
                 source: Source | None, moved: list[int]) -> Iterator[Piece]:
    """A JSON Lines file (or a .json file holding one array of objects): one document per row, the
    text in cfg.text_field. Each line is parsed by the standard library's json (its C scanner), which
    names a bad row's line directly and holds one row at a time; see ROW_MAX_BYTES for why not pyarrow."""
    with open_bytes(path, compression) as f:
        head = f.read(64).removeprefix(BOM).lstrip()
    if head.startswith(b"["):
        yield from _json_array_pieces(path, compression, index, first, cfg, source)
        return
    kind = row_kind(cfg)
    row, line_no, unreported = 0, 0, 0
    with open_bytes(path, compression) as f:
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
            if line_no == 1 and line.startswith(BOM):  # Windows tools start a UTF-8 file with one: not data
                line = line[len(BOM):]
            if not line.strip():
                continue
            row += 1
            if row <= first:
                continue
            check_parse_cost(line, f"{path}, row {line_no}", "split that document into several rows")
            try:
                obj = json_loads(line.decode("utf-8"))
            except UnicodeDecodeError as e:
                _bad_row(path, line_no, f"it is not UTF-8 (bad byte at column {e.start + 1})", source, cfg)
                continue
            except ValueError as e:
                # rows ended by a lone \r (old Mac line ends) read as one line: say so, not just "Extra data"
                lone_cr = getattr(e, "msg", "") == "Extra data" and b"\r" in line.rstrip()
                cr = "; its rows end in a lone \\r (carriage return): end them with \\n" if lone_cr else ""
                _bad_row(path, line_no, f"it is not valid JSON ({e}){cr}", source, cfg)
                continue
            if not isinstance(obj, dict):
                _bad_row(path, line_no, f"it is a JSON {type(obj).__name__}, not an object", source, cfg)
                continue
            out = kind.take(obj.get(kind.field), kind.field in obj, [index, row - 1], 0)
            if isinstance(out, str):
                _bad_row(path, line_no, out, source, cfg)
                continue
            yield from out


def _json_array_pieces(path: Path, compression: str | None, index: int, first: int, cfg: DataConfig,
                       source: Source | None) -> Iterator[Piece]:
    to_lines = f"convert it to JSON Lines, which are read a row at a time: jq -c '.[]' {path.name} > rows.jsonl"
    if compression is None and path.stat().st_size > JSON_ARRAY_MAX:  # by its size, unread
        raise UserError(f"{path} is one JSON array of {path.stat().st_size:,} bytes, over the {JSON_ARRAY_MAX:,} one "
                        f"is read at once; {to_lines}")
    with open_bytes(path, compression) as f:  # (read(JSON_ARRAY_MAX + 1) took 64 MiB for any small file)
        raw = read_stream(f, JSON_ARRAY_MAX, 0 if compression else path.stat().st_size)
    if len(raw) > JSON_ARRAY_MAX:  # (compressed: its size is known once read)
        raise UserError(f"{path} is one JSON array of more than {JSON_ARRAY_MAX:,} bytes (uncompressed), the most one "
                        f"is read at once; {to_lines}")
    check_parse_cost(raw, str(path), to_lines)
    try:
        rows = json_loads(raw.removeprefix(BOM).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); fix it, or write it as JSON Lines") from None
    kind = row_kind(cfg)
    for i, obj in enumerate(rows[first:], first):
        if not isinstance(obj, dict):
            _bad_row(path, i + 1, f"it is a JSON {type(obj).__name__}, not an object", source, cfg)
            continue
        out = kind.take(obj.get(kind.field), kind.field in obj, [index, i], 0)
        if isinstance(out, str):
            _bad_row(path, i + 1, out, source, cfg)
            continue
        yield from out


def _parquet_pieces(path: Path, compression: str | None, index: int, first: int, cfg: DataConfig,
                    source: Source | None, moved: list[int]) -> Iterator[Piece]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if compression:
        raise UserError(f"{path} is a compressed parquet file; parquet compresses inside the file: decompress it "
                        f"(e.g. gunzip or zstd -d) and name the .parquet file")
    kind = row_kind(cfg)
    fld = kind.field
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path} is not a readable parquet file ({short_error(e)}); check the file") from None
    names = pf.schema_arrow.names
    if fld not in names:
        setting = "data.messages_field" if kind.chat else "data.text_field"
        raise UserError(f"{path} has no column {fld!r} (columns: {', '.join(names)}); set {setting} to the "
                        f"one holding the {'messages' if kind.chat else 'text'}")
    col_type = pf.schema_arrow.field(fld).type
    col_type = col_type.value_type if pa.types.is_dictionary(col_type) else col_type  # (stored as a dictionary)
    if kind.chat and not (pa.types.is_list(col_type) or pa.types.is_large_list(col_type)):
        raise UserError(f"{path}'s column {fld!r} holds {col_type}, not a list of messages; set data.messages_field "
                        f"to the column holding them")
    if not kind.chat and not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
        raise UserError(f"{path}'s column {fld!r} holds {col_type}, not text; set data.text_field to a text column")
    if not kind.chat:  # its text read as a dictionary: see PARQUET_SLICE_BYTES
        try:
            pf = pq.ParquetFile(path, read_dictionary=[fld])
        except (pa.ArrowException, OSError) as e:
            raise UserError(f"{path} is not a readable parquet file ({short_error(e)}); check the file") from None
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
    size = path.stat().st_size
    decoded = 0  # the text's bytes so far (the bomb's bound)
    for batch in pf.iter_batches(batch_size=_batch_rows(pf, groups, fld), row_groups=groups, columns=[fld]):
        column = batch.column(0)
        lengths = _cell_bytes(column)
        for i, n in enumerate(lengths):  # by arithmetic: nothing of the batch is a Python object yet
            if n > ROW_MAX_BYTES:
                raise UserError(f"{path}, row {done + i + 1}: it is {n:,} bytes, over the {ROW_MAX_BYTES:,} a document "
                                f"may be; split that document into several rows")
            decoded += n
            if decoded > PARQUET_EXPANSION * size + PARQUET_SLICE_BYTES:
                raise UserError(f"{path}: its {fld!r} column decodes to over {decoded:,} bytes by row {done + i + 1}, "
                                f"more than {PARQUET_EXPANSION}x the file's {size:,} bytes, which no corpus compresses "
                                f"to (a decompression bomb, or one text repeated); if those rows are meant, write them "
                                f"out as JSON Lines")
        start = 0
        while start < len(column):  # a slice of at most PARQUET_SLICE_BYTES of text (at least one row) at a time
            end, held = start + 1, lengths[start]
            while end < len(column) and held + lengths[end] <= PARQUET_SLICE_BYTES:
                held += lengths[end]
                end += 1
            yield from _parquet_rows(column.slice(start, end - start), done + start, first, path, kind, index, cfg,
                                     source)
            start = end
        done += len(column)
        step = size * len(column) // max(pf.metadata.num_rows, 1)  # progress: the rows' share
        moved[0] += step
        yield Piece(False, "", step, None, None)


def _batch_rows(pf, groups: list[int], fld: str) -> int:
    """Rows per batch read from the file: PARQUET_ROWS, fewer where the column's pages (what the reader
    decompresses: the dictionary, or plain values) average more than PARQUET_SLICE_BYTES over that many rows."""
    rows = PARQUET_ROWS
    for g in groups:
        rg = pf.metadata.row_group(g)
        chunk = sum(rg.column(c).total_uncompressed_size for c in range(rg.num_columns)
                    if rg.column(c).path_in_schema.split(".")[0] == fld)
        rows = min(rows, max(1, PARQUET_SLICE_BYTES * rg.num_rows // max(chunk, 1)))
    return rows


def _cell_bytes(column) -> list[int]:
    """Each row's bytes, without making a string: of a dictionary column, its value's length in the dictionary;
    of a plain one, its length; of a chat row (a list of messages), the bytes its slice of the column holds."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        lengths = pc.take(pc.binary_length(column.dictionary), column.indices)
    elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        lengths = pc.binary_length(column)
    else:
        return [column.slice(i, 1).nbytes for i in range(len(column))]
    return lengths.fill_null(0).to_pylist()


def _parquet_rows(column, done: int, first: int, path: Path, kind: RowKind, index: int, cfg: DataConfig,
                  source: Source | None) -> Iterator[Piece]:
    """The documents of `column`'s rows (a slice whose first row is row `done` of the file)."""
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
        if isinstance(text, bytes):
            _bad_row(path, row + 1, "its text is not UTF-8", source, cfg)
            continue
        out = kind.take(text, True, [index, row], 0)
        if isinstance(out, str):
            _bad_row(path, row + 1, out, source, cfg)
            continue
        yield from out


def check_readable_kind(path: Path) -> None:
    """Refuse a file compressed (or archived) in a way this code does not read: read as text it would be
    garbage, and "convert it to UTF-8" the wrong fix."""
    suffix = next((s for s in NOT_READ if path.name.lower().endswith(s)), None)
    if suffix:
        raise UserError(f"{path} is {NOT_READ[suffix]}, which data.dataset does not read; decompress or extract it "
                        f"(.gz and .zst files are read as they are)")


def folder_takes(path: Path) -> bool:
    name = path.name.lower()
    for suffix in COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name.endswith(FOLDER_SUFFIXES) and not path.name.startswith(".")
