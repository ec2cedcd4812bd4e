"""Data-preparation rows: tiny shakespeare into GPT-2 token bins, with data.prepare_data (what train.py
runs before its first step when the data is not prepared yet) against nanoGPT's prepare.py; the
tokenize call alone against tiktoken's plain encode; and, on request, the peak RSS of preparing a
large synthetic source (it streams, so memory stays bounded)."""
from __future__ import annotations

import random
import resource
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
