"""Held-out exact-match accuracy on verifiable tasks (data/tasks.py): does a model answer what it was taught?

    python -m eval.chat_tasks --checkpoint out/sft --tasks tasks/heldout.jsonl

Each row's user turn is the prompt (the chat template's, ending with <|assistant|>); the reply is generated
greedily through the project's generation path (model/generate.py) until <|end|>, and counts when it equals
the row's assistant turn exactly. A model without the chat markers (a base model) is scored as fine-tuning
would start from it: its embedding grown by the same rule (model/vocab.py), so its markers are the mean row.
Prints the accuracy per kind and overall, and with --json the numbers as one JSON line.
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # a command: Ctrl-C while the imports below run is one line (errors.quiet_interrupts)
    errors.quiet_interrupts()

import json
from collections import Counter
from pathlib import Path
from typing import Sequence

import torch

from bounded import LineTooLong, opened, read_lines
from checkpoint import load_model
from data import tokenizer_from_meta
from data.chat_template import ChatTemplate, template_for
from data.formats import check_parse_cost
from data.messages import message_fault
from errors import ArgumentParser, UserError, run_cli, short_error, utf8_text
from fileio import json_loads, path_arg, read_user_file
from model.generate import generate
from model.vocab import grow_vocab

MAX_TASKS_BYTES = 256 * 2**20  # data/tasks.py's largest train.jsonl is about 100 MB; a bigger file is refused unread
MAX_ROW_BYTES = 1 << 20  # data/tasks.py's rows are under 200 bytes; a longer one would not fit a model's context
MAX_NEW_TOKENS = 24  # every answer of data/tasks.py is shorter; a reply that runs on is wrong anyway


def row_fault(row) -> str | None:
    """What keeps a parsed tasks row from being scored (a clause), or None."""
    if not isinstance(row, dict):
        return f"it is {'null' if row is None else 'a ' + type(row).__name__}, not an object with messages"
    if "messages" not in row:
        return "it has no 'messages'"
    kind = row.get("kind", "all")
    if not isinstance(kind, str) or not kind.strip():  # (a list was an unhashable-type traceback, 5 and "x" unsortable)
        return f"its kind is {'empty' if isinstance(kind, str) else 'a ' + type(kind).__name__}, not a name"
    return message_fault(row["messages"])  # every turn text, alternating, the last the assistant's non-empty answer


def numbered_rows(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, row) of a tasks .jsonl: each {"messages": [user, assistant], "kind"?}; one line naming
    the row and what is wrong with it for a bad row. Parsed as it is read, a row at a time (bounded.read_lines):
    a bad row, or a file that is no rows at all (/dev/zero), is refused by the time it is read, not after
    MAX_TASKS_BYTES of it are held."""
    fix = "name a .jsonl written by `python -m data.tasks`"
    return read_user_file(path, "--tasks", fix=fix, limit=MAX_TASKS_BYTES, reader=lambda p, limit: _parsed(p, limit, fix))


def _parsed(path: Path, limit: int, fix: str) -> list[tuple[int, dict]]:
    rows = []
    try:
        # rows end at \n, \r\n or \r, which JSON text never holds raw; not str.splitlines(), which also splits
        # inside a row at U+2028, U+0085 and the like (valid in a JSON string); a Windows BOM is not data
        with opened(path) as f:  # (an error opening or reading it: read_user_file's line)
            for n, raw in enumerate(read_lines(f, limit, MAX_ROW_BYTES), 1):
                line = utf8_text(raw.removeprefix(b"\xef\xbb\xbf") if n == 1 else raw, f"--tasks {path}, row {n}", fix)
                if not line.strip():
                    continue
                check_parse_cost(raw, f"--tasks {path}, row {n}", "regenerate it with `python -m data.tasks`")
                try:
                    row = json_loads(line)
                except ValueError as e:
                    fault = f"not valid JSON ({short_error(e)})"
                else:
                    fault = row_fault(row)
                if fault:  # not an assert: python -O would skip it
                    raise UserError(f"{path}, row {n}: {fault}; fix that row or regenerate the file with `python -m data.tasks`")
                rows.append((n, row))
    except LineTooLong as e:
        raise UserError(f"--tasks {path}, row {e.number}: it is over {MAX_ROW_BYTES:,} bytes on one line, which no "
                        f"task is; {fix}") from None
    if not rows:
        raise UserError(f"{path} holds no rows; generate them with `python -m data.tasks --out DIR`")
    return rows


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a tasks .jsonl (numbered_rows without the line numbers)."""
    return [row for _, row in numbered_rows(path)]


def check_scorable(numbered: Sequence[tuple[int, dict]], tok, template: ChatTemplate, block_size: int, path) -> None:
    """Every row's prompt and answer in the model's tokenizer (a char model's vocabulary) and within its
    context, or one line naming the row: before any scoring, not as the batch that holds it comes up. A row
    longer than the context would be generated from a cropped prompt (model/generate.py's crop rule) and
    scored wrong with nothing said."""
    for n, row in numbered:
        try:
            ids = template.encode_conversation(tok, row["messages"])[0]  # (the prompt's turns, then the answer's)
        except UserError as e:
            raise UserError(f"{path}, row {n}: {e}") from None
        needed = len(ids) - 1  # the closing <|end|> is predicted from the rest, never read
        if needed > block_size:
            raise UserError(f"{path}, row {n}: its prompt and answer need {needed} tokens of context, more than the "
                            f"model's {block_size} (block_size), so it would be scored on a cropped prompt; "
                            f"shorten or drop that row, or evaluate a model with a longer context")


@torch.no_grad()
def score(model, tok, template: ChatTemplate, rows: Sequence[dict], batch_size: int = 64, *,
          where: str | Path = "the rows", numbers: Sequence[int] | None = None) -> dict:
    """{"accuracy", "correct", "total", "by_kind": {kind: accuracy}, "examples": [(question, reply, answer)...]}.
    Every row is checked first (check_scorable), named by `where` and its number (`numbers`: the file's lines)."""
    check_scorable(list(zip(numbers or range(1, len(rows) + 1), rows)), tok, template, model.config.block_size, where)
    model.eval()
    correct: Counter = Counter()
    total: Counter = Counter()
    examples = []
    for lo in range(0, len(rows), batch_size):
        batch = rows[lo: lo + batch_size]
        prompts = [template.encode_prompt(tok, r["messages"][:-1]) for r in batch]
        out = generate(model, prompts, MAX_NEW_TOKENS, temperature=0.0, eot=template.end,
                       vocab_size=template.vocab_size)
        for r, ids in zip(batch, out):
            reply, answer = template.decode(tok, ids), r["messages"][-1]["content"]
            kind = r.get("kind", "all")
            total[kind] += 1
            correct[kind] += reply == answer
            if len(examples) < 8:
                examples.append((r["messages"][-2]["content"], reply, answer))
    n, k = sum(total.values()), sum(correct.values())
    return {"accuracy": k / n, "correct": k, "total": n,
            "by_kind": {kind: correct[kind] / total[kind] for kind in sorted(total)}, "examples": examples}


def load_chat_model(spec: str):
    """(model, tokenizer, template, note) of a checkpoint: its recorded template, or the tokenizer's with the
    embedding grown to hold the markers (a model that never saw them)."""
    loaded = load_model(spec)
    tok = tokenizer_from_meta(loaded.tokenizer)
    recorded = getattr(loaded, "chat_template", None)
    if recorded is None and loaded.checkpoint is not None and loaded.checkpoint.get("chat_template") is not None:
        recorded = ChatTemplate.from_dict(loaded.checkpoint["chat_template"])
    template = recorded or template_for(tok)
    note = grow_vocab(loaded.model, template.vocab_size, seed=0)
    return loaded.model, tok, template, (note or "") if recorded is None else ""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m eval.chat_tasks", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, type=path_arg,
                   help="a checkpoint file or out_dir (or an HF GPT-2 name/dir)")
    p.add_argument("--tasks", required=True, type=path_arg, help="held-out rows: heldout.jsonl of `python -m data.tasks`")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--json", action="store_true", help="also print the numbers as one JSON line")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    numbered = numbered_rows(args.tasks)
    model, tok, template, note = load_chat_model(args.checkpoint)
    result = score(model, tok, template, [row for _, row in numbered], args.batch_size, where=args.tasks,
                   numbers=[n for n, _ in numbered])
    if note:
        print(f"{args.checkpoint} has no chat template: {note}")
    for question, reply, answer in result["examples"][:4]:
        print(f"  {question!r} -> {reply!r} (expected {answer!r})")
    kinds = ", ".join(f"{k} {v:.1%}" for k, v in result["by_kind"].items())
    print(f"exact match: {result['accuracy']:.1%} ({result['correct']}/{result['total']}); {kinds}")
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "examples"}))
    return 0


if __name__ == "__main__":
    errors.start_up_done()  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    run_cli(main)
