"""Conversations in batches, two ways, timed on this machine (docs/chat.md's table):

    python -m benchmarks.sft_batches [--steps 20] [--rows 32]

- padding (what data/chat_loader.py does): one conversation per row, padded to the batch's longest (rounded up
  to chat_loader.PAD_MULTIPLE), plain causal attention;
- padding to block_size: the same, every batch the full context (static shapes);
- packing: conversations laid end to end in rows of block_size tokens (a conversation never split: one that
  does not fit starts the next row), positions restarting at each, and a block-diagonal causal mask so that
  none attends to another (SDPA with an explicit mask: no flash kernel on a GPU).

Each runs the forward and backward of small.yaml's shape (4 layers, 4 heads, 128 wide, block 64) at the tasks'
char vocabulary on conversations of data/tasks.py, and reports counted (assistant) tokens per second and the
wasted share of the token slots (padding). The same conversations feed every way, in the same order.
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # a command: Ctrl-C while the imports below run is one line (errors.quiet_interrupts)
    errors.quiet_interrupts()

import argparse
import random
import time

import numpy as np
import torch
import torch.nn.functional as F

from data.chat_loader import PAD_MULTIPLE
from data.chat_template import template_for
from data.tasks import generate
from data.tokenizer import CharTokenizer
from model import GPT, GPTConfig

BLOCK = 64


def conversations(n: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """(ids, counted) of n task conversations that fit the context, and the vocabulary size."""
    rows, _ = generate(n + 1, 4, seed=1)
    chars = "".join(sorted({c for r in rows for m in r["messages"] for c in m["content"]}))
    tok = CharTokenizer(chars)
    template = template_for(tok)
    out = []
    for r in rows[1:]:
        ids, mask = template.encode_conversation(tok, r["messages"])
        if len(ids) <= BLOCK + 1:
            out.append((np.array(ids), np.array(mask)))
    return out, template.vocab_size


def padded(convs, rows: int, to_block: bool):
    """Batches of `rows` conversations: (x, y, None mask, None positions, slots, counted, real tokens)."""
    for lo in range(0, len(convs) - rows + 1, rows):
        batch = convs[lo: lo + rows]
        longest = max(len(ids) for ids, _ in batch) - 1
        T = BLOCK if to_block else min(BLOCK, -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE)
        x = torch.zeros(rows, T, dtype=torch.long)
        y = torch.full((rows, T), -1, dtype=torch.long)
        for r, (ids, mask) in enumerate(batch):
            x[r, : len(ids) - 1] = torch.from_numpy(ids[:-1])
            y[r, : len(ids) - 1] = torch.from_numpy(np.where(mask[1:], ids[1:], -1))
        yield x, y, None, None, rows * T, int((y >= 0).sum()), sum(len(ids) - 1 for ids, _ in batch)


def packed(convs, rows: int):
    """Rows of BLOCK tokens, conversations end to end: (x, y, mask, positions, slots, counted, real tokens)."""
    it = iter(convs)
    pending = None
    while True:
        x = torch.zeros(rows, BLOCK, dtype=torch.long)
        y = torch.full((rows, BLOCK), -1, dtype=torch.long)
        doc = torch.full((rows, BLOCK), -1, dtype=torch.long)
        pos = torch.zeros(rows, BLOCK, dtype=torch.long)
        for r in range(rows):
            at, k = 0, 0
            while True:
                conv = pending if pending is not None else next(it, None)
                pending = None
                if conv is None:
                    return
                ids, mask = conv
                n = len(ids) - 1
                if at + n > BLOCK:
                    pending = conv
                    break
                x[r, at: at + n] = torch.from_numpy(ids[:-1])
                y[r, at: at + n] = torch.from_numpy(np.where(mask[1:], ids[1:], -1))
                doc[r, at: at + n], pos[r, at: at + n] = k, torch.arange(n)
                at, k = at + n, k + 1
        causal = torch.ones(BLOCK, BLOCK, dtype=torch.bool).tril()
        mask = ((doc[:, :, None] == doc[:, None, :]) & causal) | torch.eye(BLOCK, dtype=torch.bool)  # pads: self
        yield x, y, mask[:, None], pos, rows * BLOCK, int((y >= 0).sum()), int((doc >= 0).sum())


def loss_of(model: GPT, x, y, mask, pos):
    """The mean loss over the counted targets, through the full logits either way (the same head cost)."""
    if mask is None:
        logits = model(x)
    else:
        t = model.transformer  # the model's own modules, with the document mask and restarting positions
        h = t.drop(t.wte(x) + t.wpe(pos))
        for block in t.h:
            h = block(h, mask, None, None, None)
        logits = model.head(t.ln_f(h))
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-1)


def measure(model: GPT, batches, steps: int) -> tuple[float, float]:
    """(counted tokens per second, wasted share of the slots) over `steps` forward + backward passes."""
    batches = [b for _, b in zip(range(steps + 2), batches)]
    for x, y, mask, pos, *_ in batches[:2]:  # warm-up
        loss_of(model, x, y, mask, pos).backward()
    t0 = time.perf_counter()
    for x, y, mask, pos, *_ in batches[2:]:
        loss_of(model, x, y, mask, pos).backward()
    elapsed = time.perf_counter() - t0
    slots = sum(b[4] for b in batches[2:])
    counted = sum(b[5] for b in batches[2:])
    real = sum(b[6] for b in batches[2:])
    return counted / elapsed, 1 - real / slots


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sft_batches", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rows", type=int, default=32, help="rows per batch (padding: conversations per batch)")
    args = p.parse_args(argv)
    convs, vocab = conversations(args.rows * (args.steps + 2) * 3)
    random.Random(0).shuffle(convs)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=BLOCK, vocab_size=vocab, dropout=0.0))
    ways = {"padding (one per row, to the batch's longest)": lambda: padded(convs, args.rows, False),
            "padding to block_size": lambda: padded(convs, args.rows, True),
            "packing with a document mask": lambda: packed(convs, args.rows)}
    print(f"{len(convs)} task conversations, mean {np.mean([len(c[0]) for c in convs]):.1f} tokens; "
          f"{args.steps} steps of {args.rows} rows; torch threads {torch.get_num_threads()}")
    for name, batches in ways.items():
        rate, waste = measure(model, batches(), args.steps)
        print(f"{name:48s} {rate:10,.0f} counted tokens/s   wasted {waste:5.1%} of the token slots")
    return 0


if __name__ == "__main__":
    errors.start_up_done()  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    errors.run_cli(main)
