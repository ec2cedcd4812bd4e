"""Text sources: tiny shakespeare, local files, and HF datasets, each streamed as pieces of documents.

A source yields `(new_doc, text, advance)` tuples: `new_doc` marks the first piece of a document,
`advance` is how far the progress bar moves (bytes for files, rows for HF datasets). Long documents
come in pieces of about CHUNK_CHARS characters so that memory stays bounded whatever the corpus size.
"""
from __future__ import annotations

import codecs
import functools
import glob
import hashlib
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from errors import UserError
from fileio import atomic_write_bytes
from network import hub_offline_unless_reachable

from .config import HF_PREFIX, SHAKESPEARE, DataConfig

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_ENV = "SMALLGPT_SHAKESPEARE"

CHUNK_CHARS = 1 << 20  # characters per piece handed to the tokenizer
READ_BYTES = 1 << 20
HF_ROWS_PER_READ = 1000

Piece = tuple[bool, str, int]


@dataclass
class Source:
    slug: str  # readable, filesystem-safe name for the prepared dir
    identity: dict[str, Any]  # what the fingerprint covers: changes here mean the data changed
    total: int | None  # progress-bar total, None when unknown (streaming)
    unit: str  # progress-bar unit
    pieces: Callable[[], Iterator[Piece]]  # may be called more than once (the char tokenizer reads twice)
    files: list[Path] | None = None  # local files: their CONTENT joins the identity (see build._fingerprint)


def open_source(cfg: DataConfig) -> Source:
    """Resolve cfg.dataset to a Source, raising UserError for anything missing or unusable."""
    if cfg.dataset == SHAKESPEARE:
        path = shakespeare_path(cfg.local_path)
        return Source(
            slug=SHAKESPEARE,
            identity={"kind": SHAKESPEARE, "sha256": SHAKESPEARE_SHA256},
            total=path.stat().st_size,
            unit="B",
            pieces=lambda: _file_pieces([path]),
        )
    if cfg.dataset.startswith(HF_PREFIX):
        return _hf_source(cfg)
    return _local_source(cfg.dataset)


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


def _split_off(text: str) -> tuple[list[str], str]:
    """Cut pieces of at most CHUNK_CHARS off the front of `text` while it is longer; return them and the rest."""
    pieces = []
    while len(text) > CHUNK_CHARS:
        cut = _cut_point(text, CHUNK_CHARS)
        pieces.append(text[:cut])
        text = text[cut:]
    return pieces, text


# --- local files ----------------------------------------------------------------------------------


def _file_pieces(paths: list[Path]) -> Iterator[Piece]:
    """Each file is one document, decoded as UTF-8 incrementally and cut into pieces."""
    for path in paths:
        decoder = codecs.getincrementaldecoder("utf-8")()
        pending, new_doc, offset = "", True, 0
        with open(path, "rb") as f:
            while True:
                raw = f.read(READ_BYTES)
                try:
                    pending += decoder.decode(raw, final=not raw)
                except UnicodeDecodeError as e:
                    raise UserError(
                        f"{path} is not UTF-8 text (bad byte near offset {offset + e.start}); convert it to UTF-8 "
                        f"(e.g. iconv -t UTF-8) or leave it out of data.dataset"
                    ) from None
                offset += len(raw)
                # Keep the tail (the next read may continue it); emit the pieces before it.
                pieces, pending = _split_off(pending)
                for piece in pieces:
                    yield new_doc, piece, 0
                    new_doc = False
                if not raw:
                    break
                yield new_doc, "", len(raw)  # progress only
        yield new_doc, pending, 0


_GLOB_CHARS = re.compile(r"[*?\[]")


def _local_source(spec: str) -> Source:
    path = Path(spec).expanduser()
    if _GLOB_CHARS.search(spec) and not path.exists():  # a file or dir named with "[" is itself, not a pattern
        paths = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True) if os.path.isfile(p))
        if not paths:
            raise UserError(f"no files match data.dataset {spec!r}; check the pattern (use ** for subdirectories)")
        name = Path(_GLOB_CHARS.split(spec)[0]).name or "glob"  # the fixed part before the pattern
    elif path.is_file():
        paths, name = [path], path.stem
    elif path.is_dir():
        paths = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not paths:
            raise UserError(
                f"no .txt files under {spec}; add some, or name other files with a glob such as '{spec.rstrip('/')}/**/*.md'"
            )
        name = path.resolve().name
    else:
        raise UserError(
            f"data.dataset {spec!r} does not exist; give an existing .txt file, directory or glob, "
            f"'{SHAKESPEARE}', or 'hf:<name>'"
        )
    # The files' content identifies them (hashed by build._fingerprint, which reuses a stored hash while a
    # file's size and mtime are unchanged): touching a file is no change, editing one is.
    where = hashlib.sha256(os.path.abspath(os.path.expanduser(spec)).encode()).hexdigest()[:8]
    return Source(
        slug=f"{_safe(name)}-{where}",  # the hash keeps two different 'input.txt's apart
        identity={"kind": "files"},
        total=sum(p.stat().st_size for p in paths),
        unit="B",
        pieces=lambda: _file_pieces(paths),
        files=paths,
    )


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", name).strip("-.") or "data"


# --- tiny shakespeare -----------------------------------------------------------------------------


def shakespeare_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "smallgpt" / "tinyshakespeare" / "input.txt"


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def shakespeare_path(local_path: str = "") -> Path:
    """The verified tiny shakespeare file: data.local_path, else $SMALLGPT_SHAKESPEARE, else the cache,
    downloading it there on first use."""
    for given, what in ((local_path, "data.local_path"), (os.environ.get(SHAKESPEARE_ENV, ""), SHAKESPEARE_ENV)):
        if given:
            path = Path(given).expanduser()
            if not path.is_file():
                raise UserError(f"{what} points at {given}, which does not exist; fix the path or unset {what}")
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
    fix = f"download {SHAKESPEARE_URL} yourself and save it as {dest}, or set {SHAKESPEARE_ENV} to a copy"
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=60) as r:
            body = r.read()
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(f"could not download tiny shakespeare ({reason}); {fix}") from None
    if hashlib.sha256(body).hexdigest() != SHAKESPEARE_SHA256:
        raise UserError(f"the downloaded tiny shakespeare has the wrong sha256 (a proxy or a changed file?); {fix}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(dest, body)


# --- HF datasets ----------------------------------------------------------------------------------


def _hf_source(cfg: DataConfig) -> Source:
    name = cfg.dataset[len(HF_PREFIX):]
    subset = cfg.hf_subset or None
    field = cfg.text_field
    where = f"HF dataset {name!r}" + (f" (subset {subset!r})" if subset else "") + f" split {cfg.hf_split!r}"

    @functools.cache
    def dataset():
        import datasets  # slow to import; only HF sources need it

        hub_offline_unless_reachable()  # an unreachable hub: the cache or HF's quick offline error

        kwargs: dict[str, Any] = {"split": cfg.hf_split, "streaming": cfg.streaming}
        if cfg.num_proc > 1 and not cfg.streaming:
            kwargs["num_proc"] = cfg.num_proc
        try:
            ds = datasets.load_dataset(name, subset, **kwargs)
        except Exception as e:  # the hub, the network and the builders raise many types; all mean "can't load this"
            detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise UserError(
                f"could not load {where}: {detail}; check the name, data.hf_subset and data.hf_split on "
                f"https://huggingface.co/datasets/{name} and your network (or HF_DATASETS_OFFLINE)"
            ) from None
        columns = ds.column_names
        if columns is None:  # a streamed dataset may not know its features until the first row
            first = next(iter(ds), None)
            columns = list(first) if first is not None else [field]
        if field not in columns:
            raise UserError(
                f"{where} has no column {field!r} (columns: {', '.join(map(str, columns))}); "
                f"set data.text_field to the one holding the text"
            )
        return ds.select_columns([field])

    def pieces() -> Iterator[Piece]:
        row = 0
        for batch in dataset().iter(batch_size=HF_ROWS_PER_READ):
            for text in batch[field]:
                row += 1
                if text is None:
                    yield True, "", 1
                    continue
                if not isinstance(text, str):
                    raise UserError(
                        f"row {row} of {where} has a {type(text).__name__} in column {field!r}, not text; "
                        f"set data.text_field to a text column"
                    )
                parts, rest = _split_off(text)
                for i, part in enumerate(parts + [rest]):
                    yield i == 0, part, int(i == 0)

    # A downloaded dataset has a content fingerprint, so it is loaded now. A streamed one is identified
    # by name alone and opened only when it must be read: an up-to-date prepare needs no network.
    content = None if cfg.streaming else getattr(dataset(), "_fingerprint", None)
    return Source(
        slug=_safe("hf-" + name.replace("/", "-") + (f"-{subset}" if subset else "") + f"-{cfg.hf_split}"),
        identity={"kind": "hf", "name": name, "subset": subset, "split": cfg.hf_split, "field": field, "content": content},
        total=None if cfg.streaming else len(dataset()),
        unit="doc",
        pieces=pieces,
    )
