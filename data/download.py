"""Tiny shakespeare: a given copy (data.local_path, $SMALLGPT_SHAKESPEARE), else the cache, downloaded there on
first use; always checked against its sha256."""
from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

from errors import UserError, short_error
from fileio import atomic_write_bytes, no_empty_dirs_left

from .formats import READ_ERRORS, read_error

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_ENV = "SMALLGPT_SHAKESPEARE"
SHAKESPEARE_MAX_BYTES = 4 << 20


def shakespeare_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "smallgpt" / "tinyshakespeare" / "input.txt"


def _sha256(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except READ_ERRORS as e:
        raise read_error(path, e) from None


def shown(path: str) -> str:
    """A path for a one-line message: a long one cut in the middle."""
    return path if len(path) <= 200 else f"{path[:100]}...{path[-60:]} ({len(path)} characters)"


def shakespeare_path(local_path: str = "") -> Path:
    """The verified tiny shakespeare file: data.local_path, else $SMALLGPT_SHAKESPEARE, else the cache,
    downloading it there on first use."""
    for given, what in ((local_path, "data.local_path"), (os.environ.get(SHAKESPEARE_ENV, ""), SHAKESPEARE_ENV)):
        if given:
            path = Path(given).expanduser()
            try:
                os.stat(path)
            except OSError as e:  # the kinds below are read from it: a name too long, a loop, no permission, ...
                if e.errno != errno.ENOENT:
                    raise UserError(f"{what} points at {shown(given)}, which cannot be read ({short_error(e)}); fix the "
                                    f"path or unset {what}") from None
            except ValueError:  # a NUL byte: no such file can exist (is_file says so below)
                pass
            if path.is_dir():
                raise UserError(f"{what} points at {shown(given)}, which is a directory; point it at tiny shakespeare's "
                                f"input.txt (the file itself) or unset {what}")
            if not path.is_file():
                raise UserError(f"{what} points at {shown(given)}, which "
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
    with no_empty_dirs_left(dest.parent):  # a failed write leaves none of the folders made for it
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(dest, body)
