"""Data-preparation rows: tiny shakespeare into GPT-2 token bins, with data.prepare_data (what train.py
runs before its first step when the data is not prepared yet) against nanoGPT's prepare.py; the
tokenize call alone against tiktoken's plain encode; and, on request, the peak RSS of preparing a
large synthetic source (it streams, so memory stays bounded)."""
from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import tiktoken

from data import DataConfig, get_tokenizer, prepare_data
from data.sources import shakespeare_path

from .baseline import nanogpt_prepare
from .timing import median

ROOT = Path(__file__).resolve().parents[1]

# Run in a child so that its peak RSS (ru_maxrss of children) is the prepare's alone.
PREPARE_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from data import DataConfig, prepare_data
prepare_data(DataConfig(dataset=sys.argv[2], tokenizer="gpt2", root=sys.argv[3]), progress=False)
"""


def bench_prepare(work: Path, repeats: int, say) -> tuple[list[dict], dict, Path]:
    """(rows, info, a prepared gpt2 dir the loss check can use). Raises UserError when tiny shakespeare
    or tiktoken's files are unavailable."""
    src = shakespeare_path()
    enc = tiktoken.get_encoding("gpt2")  # loading the BPE ranks is part of neither figure
    tok = get_tokenizer("gpt2")
    text = src.read_text(encoding="utf-8")
    n_tokens = len(enc.encode_ordinary(text))
    say(f"[prepare] tiny shakespeare -> gpt2 bins ({n_tokens} tokens); {repeats} call(s) each")
    times: dict[str, list[float]] = {k: [] for k in ("base_full", "ours_full", "base_tok", "ours_tok")}
    prepared = None

    def clock(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def ours_full(r):
        nonlocal prepared
        t0 = time.perf_counter()
        prepared = prepare_data(DataConfig(tokenizer="gpt2", root=str(work / f"ours-{r}")), progress=False)
        return time.perf_counter() - t0

    def base_full(r):
        (work / f"base-{r}").mkdir(parents=True)
        return clock(lambda: nanogpt_prepare(src, work / f"base-{r}"))

    fns = {"base_full": base_full, "ours_full": ours_full,
           "base_tok": lambda r: clock(lambda: enc.encode_ordinary(text)),
           "ours_tok": lambda r: clock(lambda: tok.encode_arrays([text]))}
    tok.encode_arrays([text])  # warm-up: tokenizer objects, page cache
    for r in range(repeats):  # interleaved, the order alternating
        for pair in (("base_full", "ours_full"), ("base_tok", "ours_tok")):
            for name in (pair if r % 2 == 0 else pair[::-1]):
                times[name].append(fns[name](r))
    rows = []
    for name, base_key, ours_key in (("ours prepare_data", "base_full", "ours_full"),
                                     ("ours tokenize only", "base_tok", "ours_tok")):
        base_s, s = median(times[base_key]), median(times[ours_key])
        rows.append({"section": "prepare", "name": name, "precision": "-", "unit": "s", "ours": s, "base": base_s,
                     "ours_tok_s": n_tokens / s, "base_tok_s": n_tokens / base_s, "speedup": base_s / s,
                     "ours_times_s": times[ours_key], "base_times_s": times[base_key]})
    return rows, {"source": str(src), "tokens": n_tokens}, prepared


def prepare_peak_rss(work: Path, size_mb: int, say) -> dict:
    """Peak RSS and time of preparing `size_mb` of shakespeare lines in shuffled order (realistic text,
    not one block repeated), in a child process."""
    source = work / "synthetic.txt"
    lines = shakespeare_path().read_text(encoding="utf-8").splitlines(keepends=True)
    rng = random.Random(0)
    with open(source, "w", encoding="utf-8") as f:
        written = 0
        while written < size_mb << 20:
            rng.shuffle(lines)
            block = "".join(lines)[: (size_mb << 20) - written]
            f.write(block)
            written += len(block.encode("utf-8"))
    say(f"[prepare] {size_mb} MB synthetic source, in a child process")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", PREPARE_CHILD, str(ROOT), str(source), str(work / "big")], check=True)
    seconds = time.perf_counter() - t0
    return {"size_mb": size_mb, "seconds": seconds,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


# --- a user's corpus: a folder of jsonl files, ours against a Pool + tiktoken script ------------

CORPUS_FILE_MB = 256  # each generated jsonl file (the last one smaller)


def make_jsonl_corpus(folder: Path, size_mb: int) -> int:
    """`size_mb` of jsonl files of documents (10-60 shuffled shakespeare lines each); returns its bytes."""
    lines = shakespeare_path().read_text(encoding="utf-8").splitlines(keepends=True)
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    written, part = 0, 0
    while written < size_mb << 20:
        with open(folder / f"part-{part:04d}.jsonl", "w", encoding="utf-8") as f:
            in_file = 0
            while in_file < min(CORPUS_FILE_MB << 20, (size_mb << 20) - written):
                k = rng.randint(10, 60)
                start = rng.randrange(len(lines) - k)
                row = json.dumps({"id": part * 10**9 + in_file, "text": "".join(lines[start : start + k])}) + "\n"
                f.write(row)
                in_file += len(row.encode("utf-8"))
        written += in_file
        part += 1
    return written


def _tree_rss_mb(proc) -> float:
    """Memory of a process and all its descendants (a pool's workers count too): the sum of their PSS
    (proportional set size: pages shared by forked workers count once in all), RSS where PSS is unknown."""
    import psutil  # a dev requirement; only this row needs it

    total = 0
    try:
        p = psutil.Process(proc.pid)
        for q in [p] + p.children(recursive=True):
            try:
                info = q.memory_full_info()
                total += getattr(info, "pss", info.rss)
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return total / 2**20


def _recorded_tokens(root: Path) -> int:
    """Tokens a running prepare under `root` has recorded as done (its resume record; 0 before the first)."""
    for record in root.glob("*/.prepare-*.json"):
        try:
            return sum(s["tokens"] for s in json.loads(record.read_bytes())["splits"].values())
        except (OSError, ValueError, KeyError, TypeError):
            pass  # replaced while read: the next poll reads the new one
    return 0


def _timed(cmd: list[str], kill_when=None) -> tuple[float, float, bool]:
    """(seconds, peak MB of the whole process tree sampled every 50 ms, killed?) of a command run in its
    own session; SIGKILL the whole session as soon as `kill_when()` is true. A run to be killed is not
    sampled (its peak is 0) and is checked every 5 ms: reading a process tree's memory takes long enough on
    a busy machine for a small prepare to finish between two looks, never killed."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL)
    peak, killed = 0.0, False
    while proc.poll() is None:
        if kill_when is None:
            peak = max(peak, _tree_rss_mb(proc))
        elif kill_when():
            os.killpg(proc.pid, signal.SIGKILL)
            killed = proc.wait() == -signal.SIGKILL  # (not where it had just finished)
            break
        time.sleep(0.05 if kill_when is None else 0.005)
    if proc.returncode not in (0, -9):
        raise RuntimeError(f"{' '.join(cmd)} failed with status {proc.returncode}")
    return time.perf_counter() - t0, peak, killed


def bench_corpus(work: Path, size_mb: int, procs: int, shard_tokens: int, say) -> tuple[list[dict], dict]:
    """The corpus row: a generated jsonl folder prepared by `python -m data.prepare` and by
    benchmarks/pool_prepare.py (both with `procs` processes); MB/s and peak memory of each; then ours
    killed (SIGKILL, whole process group) once its resume record says half the tokens are done, and run
    again: the resume's time, against the uninterrupted run's. The kill is placed by progress, not by
    time, so that a slower stretch of a drifting machine doesn't move it; and the killed run and its
    resume come right after the uninterrupted one, before the baseline, for the same reason."""
    corpus = work / "corpus"
    say(f"[corpus] generating {size_mb} MB of jsonl in {corpus}")
    size = make_jsonl_corpus(corpus, size_mb)
    ours_cmd = lambda root: [sys.executable, "-m", "data.prepare", "--dataset", str(corpus), "--root", str(root),  # noqa: E731
                             "--num-proc", str(procs), "--shard-tokens", str(shard_tokens), "--no-progress"]
    say(f"[corpus] ours: python -m data.prepare, {procs} processes")
    ours_s, ours_mb, _ = _timed(ours_cmd(work / "ours"))
    prepared = next((work / "ours").iterdir())
    tokens = sum(json.loads((prepared / "meta.json").read_text())["splits"][s]["tokens"] for s in ("train", "val"))
    say(f"[corpus] ours killed once it has recorded half of the {tokens:,} tokens, then run again")
    killed_s, _, killed = _timed(ours_cmd(work / "resume"), kill_when=lambda: _recorded_tokens(work / "resume") >= tokens / 2)
    killed_at = _recorded_tokens(work / "resume") / tokens
    resume_s, resume_mb, _ = _timed(ours_cmd(work / "resume"))
    say(f"[corpus] baseline: benchmarks/pool_prepare.py (multiprocessing.Pool + tiktoken), {procs} processes")
    base_s, base_mb, _ = _timed([sys.executable, str(ROOT / "benchmarks" / "pool_prepare.py"), str(corpus),
                                 str(work / "base"), "--procs", str(procs), "--shard-tokens", str(shard_tokens)])
    same = all((prepared / p.name).read_bytes() == p.read_bytes()
               for p in next((work / "resume").iterdir()).iterdir() if p.is_file() and not p.name.startswith("."))
    mb = size / 2**20
    rows = [
        {"section": "prepare", "name": f"jsonl corpus {mb:.0f} MB (base: Pool+tiktoken)", "precision": "-", "unit": "s",
         "ours": ours_s, "base": base_s, "ours_tok_s": tokens / ours_s, "base_tok_s": tokens / base_s,
         "ours_mem_mb": ours_mb, "base_mem_mb": base_mb, "speedup": base_s / ours_s},
        {"section": "prepare", "name": "resume after kill at 50% (base: uninterrupted)", "precision": "-", "unit": "s",
         "ours": resume_s, "base": ours_s, "ours_mem_mb": resume_mb, "speedup": ours_s / resume_s},
    ]
    info = {"corpus_mb": mb, "tokens": tokens, "procs": procs, "shard_tokens": shard_tokens, "ours_s": ours_s, "base_s": base_s,
            "ours_mb_s": mb / ours_s, "base_mb_s": mb / base_s, "ours_peak_rss_mb": ours_mb, "base_peak_rss_mb": base_mb,
            "killed_at_s": killed_s, "killed_at_fraction": killed_at, "was_killed": killed, "resume_s": resume_s,
            "resume_fraction": resume_s / ours_s, "resumed_equals_uninterrupted": same}
    return rows, info
