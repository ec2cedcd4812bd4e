"""Verifiable tasks as conversations: what "it learns what it is taught" is measured on (docs/chat.md).

    python -m data.tasks --out tasks/          # tasks/train.jsonl, tasks/heldout.jsonl, tasks/pretrain.txt

Four kinds, each with one right answer, checked by exact match (eval/chat_tasks.py):
- arithmetic: "What is 23 + 45?" -> "68", "What is 47 - 21?" -> "26" (two-digit numbers, no carry or borrow);
- reversing a word: "Reverse the word: kqzt" -> "tzqk" (random letters, so nothing is remembered);
- answering in a given format: "Write kqz in capitals" -> "KQZ", "... in brackets" -> "[kqz]";
- counting the words of a sentence: "How many words: red fox runs" -> "3".

heldout.jsonl holds questions that train.jsonl does not (drawn from another seed, repeats removed). pretrain.txt
is plain text over the same characters (random sentences of the words and numbers, no task in it): a char
model pretrained on it shares the conversations' vocabulary exactly, which fine-tuning it needs (every
character of ALPHABET is in both: the first line of pretrain.txt, and one conversation that spells them).
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # a command: Ctrl-C while the imports below run is one line (errors.quiet_interrupts)
    errors.quiet_interrupts()

import json
import random
from pathlib import Path

from errors import ArgumentParser, UserError, run_cli, short_error, write_fix
from fileio import atomic_write_bytes, check_writable_dir, no_empty_dirs_left, output_target, path_arg
from ownership import check_output, check_replaceable, record_written

MAX_NUMBER = 99
# the most of each that one run makes (about 100 MB of text each): a larger count is refused before any work,
# not found out by running out of memory (or, for --heldout, by drawing 1000 questions per missing one)
MAX_TRAIN, MAX_HELDOUT, MAX_PRETRAIN_LINES = 1_000_000, 100_000, 2_000_000
WORDS = ("cat dog sun red fox lamp tree fish bird moon star rain blue cold warm milk bread stone river house "
         "green apple cloud wind door book road hill boat frog king").split()
LETTERS = "abcdefghijklmnopqrstuvwxyz"
KINDS = ("arithmetic", "reverse", "format", "count")
FILES = ("train.jsonl", "heldout.jsonl", "pretrain.txt")  # what --out receives
ALPHABET = "".join(sorted(set(LETTERS + LETTERS.upper() + "0123456789" + " \n?:+-[]")))


def arithmetic(rng: random.Random, top: int = MAX_NUMBER) -> tuple[str, str]:
    """Two two-digit numbers (at most `top`), added or subtracted column by column with no carry or borrow: the
    arithmetic a small model learns in minutes and applies to pairs it never saw (docs/chat.md: with carries it
    only remembered the sums it had seen)."""
    while True:
        a, b = rng.randint(10, top), rng.randint(10, top)
        if rng.random() < 0.5:
            if a % 10 + b % 10 < 10 and a // 10 + b // 10 < 10:
                return f"What is {a} + {b}?", str(a + b)
        else:
            a, b = max(a, b), min(a, b)
            if a % 10 >= b % 10 and a // 10 > b // 10:
                return f"What is {a} - {b}?", str(a - b)


def reverse(rng: random.Random) -> tuple[str, str]:
    word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 5)))
    return f"Reverse the word: {word}", word[::-1]


def fmt(rng: random.Random) -> tuple[str, str]:
    word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 5)))
    if rng.random() < 0.5:
        return f"Write {word} in capitals", word.upper()
    return f"Write {word} in brackets", f"[{word}]"


def count(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(1, 7)
    return f"How many words: {' '.join(rng.choice(WORDS) for _ in range(n))}", str(n)


MAKERS = {"arithmetic": arithmetic, "reverse": reverse, "format": fmt, "count": count}


def task(rng: random.Random, kind: str | None = None, top: int = MAX_NUMBER) -> dict:
    """One conversation: {"kind", "messages": [user question, assistant answer]}; numbers up to `top`."""
    kind = kind or KINDS[rng.randrange(len(KINDS))]
    question, answer = arithmetic(rng, top) if kind == "arithmetic" else MAKERS[kind](rng)
    return {"kind": kind, "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def arithmetic_questions(top: int) -> int:
    """How many different questions arithmetic(rng, top) asks."""
    pairs = [(a, b) for a in range(10, top + 1) for b in range(10, top + 1)]
    adds = sum(a % 10 + b % 10 < 10 and a // 10 + b // 10 < 10 for a, b in pairs)
    subs = sum(a >= b and a % 10 >= b % 10 and a // 10 > b // 10 for a, b in pairs)
    return adds + subs


def question_of(row: dict) -> str:
    return row["messages"][0]["content"]


def generate(n_train: int, n_heldout: int, seed: int = 0, top: int = MAX_NUMBER) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows): the held-out questions never occur in train, and each kind is a quarter of
    them. The first train row spells ALPHABET, so a char vocabulary scanned from the rows is ALPHABET whatever
    the draw."""
    rng = random.Random(seed)
    spell = {"kind": "alphabet", "messages": [{"role": "user", "content": f"Spell:{ALPHABET}"},
                                              {"role": "assistant", "content": ALPHABET}]}
    train = [spell] + [task(rng, top=top) for _ in range(n_train - 1)]
    seen = {question_of(r) for r in train}
    rng = random.Random(seed + 1_000_003)
    heldout: list[dict] = []
    for k, kind in enumerate(KINDS):
        want = n_heldout // len(KINDS) + (k < n_heldout % len(KINDS))
        for _ in range(1000 * want):
            if want == 0:
                break
            row = task(rng, kind, top)
            if question_of(row) not in seen:
                heldout.append(row)
                seen.add(question_of(row))
                want -= 1
        if want:
            raise UserError(f"train.jsonl holds nearly every {kind} question; generate fewer training rows")
    return train, heldout


def pretrain_text(n_lines: int, seed: int = 0) -> str:
    """Plain text over ALPHABET with no task in it: sentences of the words, numbers and the punctuation."""
    rng = random.Random(seed + 7)
    lines = [ALPHABET.replace("\n", "")]
    for _ in range(n_lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 8))]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99)))
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), rng.choice(["+", "-", ":", "?", "[" + rng.choice(WORDS) + "]"]))
        if rng.random() < 0.1:
            words.append(rng.choice(WORDS).upper())
        if rng.random() < 0.1:
            words.append("".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 5))))
        lines.append(" ".join(words))
    return "\n".join(lines) + "\n"


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write_bytes(path, jsonl(rows))


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m data.tasks", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=path_arg, help="folder for train.jsonl, heldout.jsonl and pretrain.txt")
    p.add_argument("--train", type=int, default=10000, help="training conversations")
    p.add_argument("--heldout", type=int, default=400, help="held-out conversations")
    p.add_argument("--pretrain-lines", type=int, default=20000, help="lines of plain text for pretraining")
    p.add_argument("--max-number", type=int, default=MAX_NUMBER, help="arithmetic on numbers from 10 to this")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 20 <= args.max_number <= 99 or not 2 <= args.train <= MAX_TRAIN or not 0 <= args.heldout <= MAX_HELDOUT \
            or not 0 <= args.pretrain_lines <= MAX_PRETRAIN_LINES:
        raise UserError(f"--max-number needs to be from 20 to 99, --train from 2 to {MAX_TRAIN:,}, --heldout from 0 to "
                        f"{MAX_HELDOUT:,} and --pretrain-lines from 0 to {MAX_PRETRAIN_LINES:,}; got {args.max_number}, "
                        f"{args.train}, {args.heldout} and {args.pretrain_lines}"[:300])
    asked, there = -(-args.heldout // len(KINDS)), arithmetic_questions(args.max_number)
    if asked > there:
        raise UserError(f"--heldout {args.heldout} asks for {asked} arithmetic questions, but --max-number "
                        f"{args.max_number} makes only {there}; ask for at most {there * len(KINDS)} held-out rows")
    out = check_output(args.out, "--out")  # the gate (ownership.py): not in a folder another command manages
    with no_empty_dirs_left(out):  # a write that fails (a full disk) leaves no empty --out behind
        check_writable_dir(out, "--out")
        for name in FILES:  # a link or a folder at one of its names: refused now, not after the others are written
            output_target(out / name, "--out's", follow=False)
        train, heldout = generate(args.train, args.heldout, args.seed, args.max_number)
        files = dict(zip(FILES, (jsonl(train), jsonl(heldout), pretrain_text(args.pretrain_lines, args.seed).encode())))
        # a file of the user's at one of its names (a 2,000-row SFT set) is refused, before any is written: only
        # what an earlier run wrote there (recorded), or the very bytes, is replaced
        check_replaceable(out, FILES, "--out", new=files)
        for name, data in files.items():  # each recorded as it is written: a rerun after a failed write replaces them
            try:
                atomic_write_bytes(out / name, data)
            except OSError as e:  # a full disk: one line (the files before it stay written, and recorded)
                raise UserError(f"cannot write {out / name} ({short_error(e)}); "
                                f"{write_fix(e, 'choose another --out')}") from None
            record_written(out, (name,), "--out")
    print(out)
    return 0


if __name__ == "__main__":
    errors.start_up_done()  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    run_cli(main)
