"""Bounded reads (bounded.py): every small file the project keeps for itself (a marker, a lock, a manifest, a build
record, a reader's record, a trained tokenizer, a cache) is read through one helper that reads at most its limit + 1
bytes. A sparse file of gigabytes at any of those names is one line naming it, with the process's address space
capped a gigabyte above what its imports took (a whole read is a MemoryError there), and the file is left as it
was. The helper itself: a property against the file's length."""
from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

import bounded
from bounded import LineTooLong, TooLarge, TooLargeError, opened, read_at_most, read_lines, read_own
from errors import UserError
from code_reading import ROOT, product_trees
import warm_runs

HUGE = 4 << 30  # sparse: no disk, and a whole read needs 4 GiB, over the cap below

# a prepared folder whose manifest is whole and names a trained tokenizer (no tokens: load_meta reads the
# tokenizer's file last)
BPE_META = {"format_version": 2, "tokenizer": "bpe:512", "vocab_size": 512, "eot": 511, "dtype": "uint16",
            "chars": None, "fingerprint": "f", "tokens_sha256": "t", "tokenizer_file": "tokenizer-abc.json",
            "splits": {s: {"tokens": 0, "bytes": 0} for s in ("train", "val")}, "shards": {"train": [], "val": []}}

# reader: (the file made huge, under the folder `d`; what the folder holds besides; the call that reads it;
#          "refused" (one line naming the file) or the value it returns, the file being none of ours)
READERS = {
    "owner marker (ownership._marked)": (".smallgpt-owner.json", {}, "ownership.kind_of(d)", "refused"),
    "owner marker, writing one (ownership.mark)": (".smallgpt-owner.json", {}, "ownership.mark(d, 'out_dir')", "refused"),
    "a meta.json around a target (ownership._is_manifest)": ("meta.json", {}, "ownership.kind_of(d, around=True)", None),
    "train lock (locks.DirLock)": (".train.lock", {}, "locks.DirLock(d, '.train.lock').try_acquire()", "refused"),
    "prepare lock (data.holds)": (".prepare.lock", {}, "data.holds.wait_for_lock(locks.DirLock(d, '.prepare.lock'), d)",
                                  "refused"),
    "reader record (data.holds.live_readers)": (".readers/h-1.json", {}, "data.holds.live_readers(d)", "refused"),
    "manifest (data.manifest.load_meta)": ("meta.json", {}, "data.manifest.load_meta(d)", "refused"),
    "manifest, rebuilding (data.build._rebuild_reason)": ("meta.json", {},
                                                          "data.build._rebuild_reason(d, DataConfig(), 'f')", "refused"),
    "trained tokenizer (data.manifest.load_meta)": ("tokenizer-abc.json", {"meta.json": BPE_META},
                                                    "data.manifest.load_meta(d)", "refused"),
    "trained tokenizer, resumed (data.build_writer)": (
        "tokenizer-abc.json", {}, "data.build_writer._tokenizer_for(d, 'abc', DataConfig(tokenizer='bpe:512'), None, "
        "None, {'tokenizer_sha256': 'x'}, False)", "refused"),
    "build record (data.shards.load_resume_state)": (".prepare-abc.json", {},
                                                     "data.shards.load_resume_state(d, 'abc', 'f', print)", "refused"),
    # a cache: too large (a corpus of millions of files), its files are hashed again, as when it is damaged
    "source hashes (data.fingerprint)": (".source-hashes.json", {}, "data.fingerprint.previous_records(d)", []),
    "choice cache (runtime.choices)": ("choices.json", {}, "runtime.choices._read()", None),
    "metrics log, resuming (training.report.metrics)": ("metrics.jsonl", {},
                                                        "training.report.metrics.MetricsLog(d).resume_at(5)", "refused"),
}

# the child: imports first, then the address space capped at what they took plus 1 GiB, then the read
CHILD = """
import json, os, resource, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import data.build, data.build_writer, data.fingerprint, data.holds, data.manifest, data.shards, locks, ownership
from data import DataConfig
if "training.report" in sys.argv[3]:
    import training.report.metrics
if "runtime.choices" in sys.argv[3]:
    import runtime.choices
    runtime.choices.cache_path = lambda: Path(sys.argv[2]) / "choices.json"
from errors import UserError
d = Path(sys.argv[2])
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30) if hard < 0 else min(vm + (1 << 30), hard), hard))
try:
    out = {"value": repr(eval(sys.argv[3]))}
except UserError as e:
    out = {"error": str(e)}
except BaseException as e:
    out = {"crash": type(e).__name__}
print(json.dumps(out))
"""


@pytest.mark.parametrize("reader", READERS)
def test_a_huge_file_at_an_own_files_name_is_one_line_in_little_memory_and_is_kept(tmp_path, reader):
    name, beside, call, expected = READERS[reader]
    d = tmp_path / "d"
    big = d / name
    big.parent.mkdir(parents=True)
    for other, content in beside.items():
        (d / other).write_text(json.dumps(content))
    with big.open("wb") as f:
        f.truncate(HUGE)
    r = warm_runs.run(["-c", CHILD, ROOT, d, call])
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if expected == "refused":
        assert "error" in out, out  # (without the bound: {"crash": "MemoryError"})
        line = out["error"]
        assert len(line.splitlines()) == 1 and str(big) in line, line
        assert f"{HUGE:,} bytes" in line and "move it away" in line, line
    else:
        assert out == {"value": repr(expected)}, out
    assert big.stat().st_size == HUGE and big.stat().st_blocks == 0  # neither replaced nor written


@given(size=st.integers(0, 3000), limit=st.integers(0, 3000))
def test_read_at_most_returns_the_file_up_to_its_limit_and_refuses_past_it(tmp_path_factory, size, limit):
    path = tmp_path_factory.mktemp("r") / "f"
    content = os.urandom(size)
    path.write_bytes(content)
    if size <= limit:
        assert read_at_most(path, limit) == content
    else:
        with pytest.raises(TooLarge) as e:
            read_at_most(path, limit)
        assert e.value.size == size
        with pytest.raises(TooLargeError, match=rf"^{path} is {size:,} bytes, but it should be a thing, at most "
                                                rf"{limit:,} bytes; fix it$"):
            read_own(path, "a thing", limit=limit, fix="fix it")


@given(pieces=st.lists(st.sampled_from([b"a", b"xyz", b"\r", b"\n", b"\r\n", "é".encode()]), max_size=40),
       chunk=st.sampled_from([1, 2, 3, 7, 1 << 14]), limit=st.integers(0, 80))
def test_read_lines_gives_the_lines_split_at_every_line_end_whatever_the_chunks(tmp_path_factory, pieces, chunk, limit):
    """The reference: re.split over the whole text (its empty last piece after a final end is no line). Chunks of
    a few bytes cut \r\n in two; a limit refuses past it, a line limit at the first line longer."""
    import re
    text = b"".join(pieces)
    path = tmp_path_factory.mktemp("lines") / "f"
    path.write_bytes(text)
    expected = re.split(rb"\r\n|\r|\n", text)
    expected = expected[:-1] if expected[-1] == b"" else expected
    old, bounded.LINE_CHUNK = bounded.LINE_CHUNK, chunk
    try:
        with opened(path) as f:
            if len(text) > limit:
                with pytest.raises(TooLarge):
                    list(read_lines(f, limit))
                return
            assert list(read_lines(f, limit)) == expected
        longest = max(map(len, expected), default=0)
        with opened(path) as f:
            if longest > 2:
                with pytest.raises(LineTooLong) as e:
                    list(read_lines(f, limit, line_limit=2))
                assert e.value.number == next(n for n, line in enumerate(expected, 1) if len(line) > 2)
            else:
                assert list(read_lines(f, limit, line_limit=2)) == expected
        with opened(path) as f:  # skip_long: None for each line over the limit, the others as they are
            assert list(read_lines(f, limit, 2, skip_long=True)) == [None if len(x) > 2 else x for x in expected]
    finally:
        bounded.LINE_CHUNK = old


def test_a_device_past_the_limit_is_refused_after_limit_plus_one_bytes():
    with pytest.raises(TooLargeError, match="/dev/zero is more than 10 bytes"):
        read_own("/dev/zero", "a thing", limit=10, fix="fix it")
    assert read_at_most("/dev/null", 10) == b""
    with pytest.raises(FileNotFoundError):  # missing: each reader's own rule
        read_at_most("/nonexistent/x", 10)


@pytest.mark.parametrize("kind", ["a pipe", "/proc (size 0)"])
def test_a_file_with_no_size_under_a_large_limit_is_read_in_chunks(tmp_path, kind):
    """What has no size (a pipe: --prompt-file <(...); /proc files report 0) was read with read(limit + 1): 1 GiB
    of memory for a few bytes. Read in chunks now: the peak is about one chunk, and the bytes are all there."""
    import tracemalloc

    if kind == "a pipe":
        r, w = os.pipe()
        os.write(w, b"hello\n" * 1000)
        os.close(w)
        path, want = f"/proc/self/fd/{r}", b"hello\n" * 1000
    else:
        path, want = "/proc/self/cmdline", None
    tracemalloc.start()
    try:
        got = read_at_most(path, 1 << 30)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    assert got == (want if want is not None else Path("/proc/self/cmdline").read_bytes())


def test_a_small_file_under_a_large_limit_takes_its_own_size_of_memory(tmp_path):
    """read(limit + 1) takes the limit's bytes of memory at once, whatever the file holds (a 40-byte prompt under
    read_user_file's 1 GiB limit took 1 GiB): a regular file is read at its own size, and one that grew since its
    size was taken is still read to the limit and refused past it."""
    import tracemalloc

    path = tmp_path / "f"
    path.write_bytes(b"x" * 40)
    tracemalloc.start()
    try:
        assert read_at_most(path, 1 << 30) == b"x" * 40
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    real_fstat = os.fstat
    grown = lambda fd: os.stat_result((*real_fstat(fd)[:6], 10, *real_fstat(fd)[7:]))  # size 10 when taken
    with pytest.MonkeyPatch.context() as m:
        m.setattr(os, "fstat", grown)
        assert read_at_most(path, 40) == b"x" * 40
        with pytest.raises(TooLarge):
            read_at_most(path, 39)


# whole-file reads the product may keep: files of the package itself, of the kernel, or of a read that is
# bounded by arithmetic just before it
WHOLE_READS_KEPT = {
    ("fileio", "f.read()"),  # /proc/<pid>/stat
    ("checkpoint.hf", "REMOTE_CODE.read_bytes()"),  # checkpoint/remote_code/modeling_smallgpt.py, shipped
    ("server.app", "PAGE.read_text(encoding='utf-8')"),  # server/page.html, shipped
    ("data.shards", "f.read()"),  # sample_sha256: only a file of at most SAMPLE_BLOCKS * SAMPLE_BLOCK bytes
    ("bench", "out.read_text()"),  # the JSON its own child process wrote
}


def whole_reads(trees: dict[str, ast.AST]) -> set[tuple[str, str]]:
    """Every read_bytes(), read_text() and argument-less read() in `trees`: a read to a file's end."""
    return {(m, ast.unparse(n)) for m, tree in trees.items() if not m.startswith("benchmarks") for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and (n.func.attr in ("read_bytes", "read_text") or n.func.attr == "read" and not n.args and not n.keywords)}


def test_no_file_of_ours_is_read_to_its_end_outside_bounded():
    """A new reader of a bookkeeping file goes through bounded.read_own (or fileio.read_user_file), or is here."""
    assert whole_reads(product_trees()) <= WHOLE_READS_KEPT, whole_reads(product_trees()) - WHOLE_READS_KEPT
    old = ast.parse("info = json_loads((path / MARKER).read_bytes()[:4096])\nraw = f.read()\nx = f.read(10)")
    assert whole_reads({"ownership": old}) == {("ownership", "(path / MARKER).read_bytes()"), ("ownership", "f.read()")}


def test_a_stream_without_a_size_is_read_in_chunks_up_to_the_limit_plus_one():
    """bounded.read_stream, as data/formats.py reads a (compressed) .json array: a few bytes under a 64 MiB limit
    took 64 MiB with read(limit + 1); a stream past the limit gives limit + 1 bytes, for its caller to refuse."""
    import gzip
    import io
    import tracemalloc

    from bounded import read_stream

    small = gzip.compress(b'[{"text": "hi"}]')
    tracemalloc.start()
    try:
        got = read_stream(gzip.GzipFile(fileobj=io.BytesIO(small)), 64 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == b'[{"text": "hi"}]' and peak < 4 << 20, peak
    big = gzip.compress(b"x" * (3 << 20))
    assert len(read_stream(gzip.GzipFile(fileobj=io.BytesIO(big)), 2 << 20)) == (2 << 20) + 1


def test_a_prepared_folders_files_too_large_to_be_ours_say_one_fix(tmp_path):
    """The resume record (data.shards) and the manifest (data.manifest) name the same fix, data.root included:
    the record's said only "move it away, then rerun"."""
    import data.manifest
    import data.shards

    for name in (".prepare-abc.json", "meta.json"):
        with (tmp_path / name).open("wb") as f:
            f.truncate(HUGE)  # sparse: refused by its size, unread
    lines = []
    for call in (lambda: data.shards.load_resume_state(tmp_path, "abc", "f", print),
                 lambda: data.manifest.load_meta(tmp_path)):
        with pytest.raises(UserError) as e:
            call()
        lines.append(str(e.value))
    assert all(line.endswith(data.shards.MOVE_AWAY) and "data.root" in line for line in lines), lines
