"""Data pipeline benchmark: gpt2 tokenizing speed, peak memory on a 1 GB source, get_batch latency.

    python benchmarks/bench_data.py [--size-mb 1024]

Targets (issue 3): tiny shakespeare with gpt2 in < 2 s; peak RSS < 1.5 GB while preparing 1 GB of
text (it streams); get_batch < 1 ms at batch 12. The synthetic source is written to a temp dir and
deleted afterwards. Needs TIKTOKEN_CACHE_DIR and SMALLGPT_SHAKESPEARE offline (see tests/conftest.py).
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tiktoken_cache"))
os.environ.setdefault("SMALLGPT_SHAKESPEARE", str(SHARED / "data/tinyshakespeare/input.txt"))

from data import BatchLoader, DataConfig, get_tokenizer, prepare_data  # noqa: E402
from data.sources import shakespeare_path  # noqa: E402

# Run in a child so that its peak RSS (ru_maxrss of children) is the prepare's alone.
PREPARE_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from data import DataConfig, prepare_data
prepare_data(DataConfig(dataset=sys.argv[2], tokenizer="gpt2", root=sys.argv[3]), progress=False)
"""


def write_synthetic(path: Path, size_mb: int) -> None:
    """size_mb of shakespeare lines in shuffled order: realistic text, not one block repeated."""
    lines = shakespeare_path().read_text(encoding="utf-8").splitlines(keepends=True)
    rng = random.Random(0)
    target = size_mb << 20
    with open(path, "w", encoding="utf-8") as f:
        written = 0
        while written < target:
            rng.shuffle(lines)
            block = "".join(lines)[: target - written]
            f.write(block)
            written += len(block.encode("utf-8"))


def time_tokenize(tokenizer: str = "gpt2") -> float:
    """Seconds to tokenize tiny shakespeare in one encode_arrays call (tokenizer loaded beforehand)."""
    text = shakespeare_path().read_text(encoding="utf-8")
    tok = get_tokenizer(tokenizer)
    t = time.perf_counter()
    tok.encode_arrays([text])
    return time.perf_counter() - t


def time_prepare(root, tokenizer: str = "gpt2") -> tuple[float, Path]:
    """(seconds, prepared dir) of prepare_data for tiny shakespeare into `root`: load + tokenize + write,
    the whole of what train.py runs before its first step when the data is not prepared yet."""
    t = time.perf_counter()
    out = prepare_data(DataConfig(tokenizer=tokenizer, root=str(root)), progress=False)
    return time.perf_counter() - t, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=1024, help="size of the synthetic source")
    args = p.parse_args()
    rows = []

    rows.append(("tokenize tiny shakespeare, gpt2 (1 call)", f"{time_tokenize():.2f} s", "< 2 s"))

    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        seconds, out = time_prepare(tmp)
        rows.append(("prepare shakespeare-gpt2 (load + tokenize + write)", f"{seconds:.2f} s", "< 2 s"))

        loader = BatchLoader(out, "train", block_size=256, batch_size=12, seed=0)
        loader.get_batch(0)
        n = 2000
        t = time.perf_counter()
        for step in range(n):
            loader.get_batch(step)
        rows.append(("get_batch, batch 12 x block 256", f"{(time.perf_counter() - t) / n * 1e3:.3f} ms", "< 1 ms"))

        source = Path(tmp) / "synthetic.txt"
        write_synthetic(source, args.size_mb)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", PREPARE_CHILD, str(ROOT), str(source), str(Path(tmp) / "prepared")], check=True)
        seconds = time.perf_counter() - t
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux reports KiB
        rows.append((f"prepare {args.size_mb} MB synthetic, gpt2: peak RSS", f"{peak_mb:.0f} MB", "< 1536 MB"))
        rows.append((f"prepare {args.size_mb} MB synthetic, gpt2: time", f"{seconds:.0f} s ({args.size_mb / seconds:.1f} MB/s)", ""))

    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'result':>20}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>20}  {target}")


if __name__ == "__main__":
    main()
