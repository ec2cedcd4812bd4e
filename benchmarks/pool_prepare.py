"""The baseline of bench.py's corpus row: a corpus prepared the way build-nanogpt's fineweb.py does it,
written here from its description (not copied): a multiprocessing.Pool maps tiktoken's gpt2 over the
documents (each prefixed with eot), the main process fills fixed-size uint16 shards in order, the
first shard is val, the rest train. No resume, no checks.

    python benchmarks/pool_prepare.py CORPUS_DIR OUT_DIR [--shard-tokens N] [--procs N]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import tiktoken

_enc = None


def _init() -> None:
    global _enc
    _enc = tiktoken.get_encoding("gpt2")


def tokenize(text: str) -> np.ndarray:
    ids = [_enc.eot_token] + _enc.encode_ordinary(text)
    return np.array(ids, dtype=np.uint16)


def documents(corpus: Path):
    for path in sorted(corpus.rglob("*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)["text"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("corpus", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--shard-tokens", type=int, default=100_000_000)
    p.add_argument("--procs", type=int, default=max(1, (os.cpu_count() or 2) // 2))  # fineweb.py: half the cores
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    buf = np.empty(args.shard_tokens, dtype=np.uint16)
    n, shard = 0, 0

    def write(tokens: np.ndarray) -> None:
        nonlocal shard
        split = "val" if shard == 0 else "train"
        tokens.tofile(args.out / f"{split}_{shard:06d}.bin")
        shard += 1

    with mp.Pool(args.procs, initializer=_init) as pool:
        for tokens in pool.imap(tokenize, documents(args.corpus), chunksize=16):
            while len(tokens):
                take = min(len(tokens), args.shard_tokens - n)
                buf[n : n + take] = tokens[:take]
                n, tokens = n + take, tokens[take:]
                if n == args.shard_tokens:
                    write(buf)
                    n = 0
    if n:
        write(buf[:n])


if __name__ == "__main__":
    main()
