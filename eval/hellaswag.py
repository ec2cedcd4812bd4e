"""HellaSwag, completion style: the benchmark GPT-2 reproductions are judged by (build-nanogpt, llm.c).

    python -m eval.hellaswag --checkpoint out/small               # Rowan/hellaswag from the HF hub
    python -m eval.hellaswag --checkpoint gpt2 --data hellaswag_val.jsonl --limit 1000

Each item is a context and 4 candidate endings, one of them right. The model scores each ending by the
log-probabilities of the ending's tokens given the context (context tokens = encode(ctx), ending tokens =
encode(" " + ending)):
- acc:      the ending with the highest SUM of log-probs is the model's choice;
- acc_norm: the ending with the highest MEAN log-prob per token (so long endings are not penalised just
            for being long). GPT-2 124M scores 0.2859 acc, 0.2955 acc_norm on the 10042 validation items.
This is not lm-evaluation-harness's protocol (that one normalises by bytes, and reports 0.2892 / 0.3114).

Sequences longer than the block are cropped from the left (see `_window`). Several items' 4 x (context +
ending) rows run as one left-padded batch with the model's `pad_mask`, which gives each row the logits it
gets alone.

For the training loop: `load_items(path)` once, then every so often
`hellaswag_metrics(all_reduce(evaluate_hellaswag(model, items, tok, rank=r, world_size=w, ...)))`.
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # a command: Ctrl-C while the imports below run is one line (errors.quiet_interrupts)
    errors.quiet_interrupts()

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm

from data import tokenizer_from_meta
from data.messages import lone_surrogate
from checkpoint import load_model
from errors import ArgumentParser, UserError, clipped, run_cli, short_error
from fileio import json_loads, path_arg, read_user_file
from network import hub_offline_unless_reachable
from runtime.device import resolve_device
from runtime.precision import DTYPE_BY_NAME, DTYPE_NAMES, autocast

HF_DATASET = "Rowan/hellaswag"
HF_SPLIT = "validation"
N_ENDINGS = 4
MAX_DATA_BYTES = 256 * 2**20  # HellaSwag's val jsonl is ~11 MB
ITEM_FORMAT = "each item needs ctx (a string), endings (a list of 4 non-empty strings) and label (0..3)"
# what to read our figures against: a random choice, and GPT-2 124M on the 10042 validation items in this
# protocol (as build-nanogpt and llm.c report it)
REFERENCES = {"chance": {"acc": 0.25, "acc_norm": 0.25}, "GPT-2 124M (published)": {"acc": 0.2859, "acc_norm": 0.2955}}


@dataclass(frozen=True)
class Item:
    ctx: str
    endings: tuple[str, ...]  # 4 of them
    label: int  # index of the right ending


# ------------------------------------------------------------------------------------------- data

def parse_item(raw: Any, where: str) -> Item:
    """One HellaSwag record (the original jsonl's or the HF copy's, where label is a string) -> Item.
    A malformed record is a UserError naming `where` (its line or row)."""
    def bad(problem: str) -> UserError:
        return UserError(f"{where}: {problem}; {ITEM_FORMAT}, as in HellaSwag's hellaswag_val.jsonl")

    if not isinstance(raw, dict):
        raise bad(f"expected a JSON object, got {type(raw).__name__}")
    ctx, endings, label = raw.get("ctx"), raw.get("endings"), raw.get("label")
    if not isinstance(ctx, str):
        raise bad("ctx is missing or not a string")
    if not isinstance(endings, (list, tuple)):
        raise bad(f"endings is {'missing' if endings is None else 'a ' + type(endings).__name__}, not a list")
    if len(endings) != N_ENDINGS:
        raise bad(f"expected {N_ENDINGS} endings, got {len(endings)}")
    if not all(isinstance(e, str) for e in endings):
        raise bad("an ending is not a string")
    for what, text in (("ctx", ctx), *((f"ending {i}", e) for i, e in enumerate(endings))):
        where_bad = lone_surrogate(text)  # JSON's "\ud800" is valid JSON but no text (as a chat row's is refused)
        if where_bad:
            raise bad(f"{what} holds a lone surrogate ({where_bad}), no text")
    blank = [i for i, e in enumerate(endings) if not e.strip()]
    if blank:  # an empty ending scores as one space token: the choice would mean nothing (all empty: "acc 1.0")
        raise bad(f"ending {blank[0]} is empty")
    # the HF copy stores "0".."3": only those strings, never int() of any digits (4301 of them are a
    # ValueError traceback, and "²".isdigit() is True but int("²") fails)
    if isinstance(label, str) and label.strip() in [str(i) for i in range(N_ENDINGS)]:
        label = int(label.strip())
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < N_ENDINGS:
        raise bad(f"label must be 0..{N_ENDINGS - 1}, got {clipped(label)}")
    return Item(ctx, tuple(endings), label)


def read_jsonl(path: str | Path) -> list[Item]:
    """Items from a jsonl file in HellaSwag's original format (one JSON object a line)."""
    p = Path(path).expanduser()
    data = read_user_file(p, "HellaSwag data file", limit=MAX_DATA_BYTES,
                          fix=f"check --data, or leave --data out to load {HF_DATASET} from the HF hub")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"HellaSwag data file {p} is not UTF-8 text; pass the jsonl file, e.g. hellaswag_val.jsonl") from None
    items = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{p} line {lineno}"
        try:
            raw = json_loads(line)  # a row nested too deep for the parser is invalid JSON too, not a RecursionError
        except json.JSONDecodeError as e:
            raise UserError(f"{where} is not valid JSON ({e.msg}); the file must hold one JSON object a line") from None
        items.append(parse_item(raw, where))
    if not items:
        raise UserError(f"HellaSwag data file {p} holds no items; pass hellaswag_val.jsonl")
    return items


def load_hf_items() -> list[Item]:
    """The validation split of Rowan/hellaswag through HF datasets (downloaded once, then cached)."""
    try:
        import datasets
    except ImportError:
        raise UserError("loading HellaSwag from the HF hub needs the `datasets` package: `pip install datasets`, "
                        "or pass --data hellaswag_val.jsonl") from None
    hub_offline_unless_reachable()  # an unreachable hub: the cache or HF's quick offline error, not 30 s of retries
    try:
        ds = datasets.load_dataset(HF_DATASET, split=HF_SPLIT)
    except Exception as e:  # offline, hub errors, a broken cache: all the same to the user
        raise UserError(f"cannot load {HF_DATASET} ({HF_SPLIT}) from the HF hub ({short_error(e, 120)}); "
                        "connect to the network once, or pass a local copy with --data hellaswag_val.jsonl") from None
    return [parse_item(row, f"{HF_DATASET} {HF_SPLIT} row {i}") for i, row in enumerate(ds)]


def load_items(data: str | Path | None = None, limit: int | None = None) -> list[Item]:
    """A local jsonl (HellaSwag's original format) or, with data=None, Rowan/hellaswag's validation split.
    `limit` keeps the first `limit` items."""
    items = read_jsonl(data) if data is not None else load_hf_items()
    return items[:limit] if limit is not None else items


# ------------------------------------------------------------------------------------------- scoring

def check_tokenizer(tok) -> None:
    """HellaSwag is English prose: only a BPE tokenizer (gpt2's) can encode all of it."""
    if getattr(tok, "chars", None) is not None:
        raise UserError(f"this model uses a character-level tokenizer ({len(tok.chars)} characters), which can't "
                        "encode HellaSwag's text (its vocabulary lacks characters the benchmark uses); "
                        "evaluate a model trained with the gpt2 tokenizer (data.tokenizer: gpt2)")


def _window(ctx: list[int], ending: list[int], block_size: int) -> tuple[list[int], int]:
    """The tokens one row feeds the model, and how many of its last tokens are scored.

    The row is context + ending, cropped from the left to block_size tokens: a long context loses its
    start and the ending stays whole. An ending of block_size tokens or more is cropped too (its start
    goes, as a context's would), since a token can only be scored if the one before it is in the row;
    real HellaSwag endings are far shorter than any usable block."""
    row = (ctx + ending)[-block_size:]
    return row, min(len(ending), len(row) - 1)


def _score_rows(model, rows: list[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum and mean log-prob of each row's scored (last n) tokens: two (B,) fp32 tensors.

    The rows are left-padded to a common length T, so every row ends at T-1 and its n scored tokens
    sit at T-n..T-1, predicted by the logits at T-n-1..T-2."""
    device = model.lm_head.weight.device
    T = max(len(ids) for ids, _ in rows)
    L = max(n for _, n in rows)  # the longest scored span in the batch
    idx = torch.zeros(len(rows), T, dtype=torch.long)  # pad id 0: any id works, the mask hides it
    pad_mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for b, (ids, _) in enumerate(rows):
        idx[b, T - len(ids):] = torch.tensor(ids)
        pad_mask[b, T - len(ids):] = True
    idx, pad_mask = idx.to(device), pad_mask.to(device)
    n = torch.tensor([n for _, n in rows], device=device)  # (B,)

    logits = model(idx, pad_mask=pad_mask)  # (B, T, V)
    # fp32 log_softmax: in bf16, log-probs of rare tokens lose the digits that separate the endings
    logp = F.log_softmax(logits[:, T - 1 - L:T - 1].float(), dim=-1)  # (B, L, V)
    token_logp = logp.gather(-1, idx[:, T - L:].unsqueeze(-1)).squeeze(-1)  # (B, L)
    scored = torch.arange(L, device=device) >= (L - n).unsqueeze(1)  # (B, L): each row's last n
    total = torch.where(scored, token_logp, 0.0).sum(1)  # (B,)
    return total, total / n


@dataclass
class Scores:
    sum_logprob: torch.Tensor  # (N, 4): summed log-prob of each ending's tokens -> acc
    mean_logprob: torch.Tensor  # (N, 4): the mean per token -> acc_norm
    labels: torch.Tensor  # (N,)

    @property
    def pred(self) -> torch.Tensor:
        return self.sum_logprob.argmax(1)

    @property
    def pred_norm(self) -> torch.Tensor:
        return self.mean_logprob.argmax(1)


@torch.no_grad()
def score_items(model, items: Sequence[Item], tokenizer, *, batch_size: int = 8,
                autocast_ctx: Callable[[], ContextManager] | None = None, progress: bool = False) -> Scores:
    """Every ending's summed and mean log-prob, for `items` in their order; `batch_size` items (4 rows
    each) run at a time. `model`: the plain GPT (not DDP-wrapped), on its device; it runs in eval mode
    and goes back to the mode it was in. `autocast_ctx()` (default: none) wraps each forward."""
    check_tokenizer(tokenizer)
    block_size = model.config.block_size
    rows = []  # 4 per item
    for item in items:
        # an empty context would leave the first ending token without a prediction: start from eot
        ctx = tokenizer.encode(item.ctx) or [tokenizer.eot]
        rows += [_window(ctx, tokenizer.encode(" " + e), block_size) for e in item.endings]
    # items of similar length share a batch, so little of it is padding; the order of results is kept
    order = sorted(range(len(items)), key=lambda i: max(len(r) for r, _ in rows[4 * i:4 * i + 4]))
    sums = torch.zeros(len(items), N_ENDINGS)
    means = torch.zeros(len(items), N_ENDINGS)
    autocast_ctx = autocast_ctx or contextlib.nullcontext
    was_training = model.training
    model.eval()
    try:
        with tqdm(total=len(items), unit="item", desc="hellaswag", disable=not progress, file=sys.stderr) as bar:
            for start in range(0, len(order), batch_size):
                chunk = order[start:start + batch_size]
                with autocast_ctx():
                    s, m = _score_rows(model, [rows[4 * i + j] for i in chunk for j in range(N_ENDINGS)])
                sums[chunk] = s.view(-1, N_ENDINGS).cpu()
                means[chunk] = m.view(-1, N_ENDINGS).cpu()
                bar.update(len(chunk))
    finally:
        model.train(was_training)
    return Scores(sums, means, torch.tensor([item.label for item in items], dtype=torch.long))


def evaluate_hellaswag(model, items: Sequence[Item], tokenizer, *, batch_size: int = 8,
                       autocast_ctx: Callable[[], ContextManager] | None = None, rank: int = 0,
                       world_size: int = 1, progress: bool = False) -> dict[str, int]:
    """Counts over this rank's shard, items[rank::world_size]: {"correct", "correct_norm", "total"}.
    Sum them over the ranks (all_reduce), then `hellaswag_metrics` turns them into accuracies."""
    shard = list(items[rank::world_size])
    if not shard:  # more ranks than items: this rank adds nothing
        return {"correct": 0, "correct_norm": 0, "total": 0}
    scores = score_items(model, shard, tokenizer, batch_size=batch_size, autocast_ctx=autocast_ctx, progress=progress)
    return {
        "correct": int((scores.pred == scores.labels).sum()),
        "correct_norm": int((scores.pred_norm == scores.labels).sum()),
        "total": len(shard),
    }


def hellaswag_metrics(counts: dict[str, Any]) -> dict[str, float]:
    """{"correct", "correct_norm", "total"} (numbers or 0-d tensors) -> {"hellaswag/acc", "hellaswag/acc_norm"}."""
    total = float(counts["total"])
    if total <= 0:
        raise ValueError("no HellaSwag items were scored")
    return {"hellaswag/acc": float(counts["correct"]) / total, "hellaswag/acc_norm": float(counts["correct_norm"]) / total}


# ------------------------------------------------------------------------------------------- CLI



def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m eval.hellaswag",
                description="HellaSwag accuracy (completion style, as build-nanogpt and llm.c score it).")
    p.add_argument("--checkpoint", required=True, type=path_arg,
                   help="ckpt file or training out_dir; or an HF GPT-2 directory or hub name (e.g. gpt2)")
    p.add_argument("--data", default=None, type=path_arg,
                   help=f"local jsonl in HellaSwag's original format (default: {HF_DATASET}, {HF_SPLIT} split, "
                        "from the HF hub)")
    p.add_argument("--limit", type=int, default=None, help="score only the first N items")
    p.add_argument("--batch-size", type=int, default=8, help="items per forward pass, 4 rows each (default: %(default)s)")
    p.add_argument("--device", default="auto", help="auto (cuda if there is one, else cpu; the default), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=DTYPE_NAMES,
                   help="autocast dtype of the forward pass; auto: float32, the precision of the published "
                        "figures (evaluation is cheap next to training)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object (with the references)")
    return p


def report(description: str, counts: dict[str, int], metrics: dict[str, float], as_json: bool) -> str:
    """The result beside chance and GPT-2 124M's published figures: a small table, or one JSON object."""
    ours = {"acc": metrics["hellaswag/acc"], "acc_norm": metrics["hellaswag/acc_norm"]}
    if as_json:
        return json.dumps({"model": description, "items": counts["total"], **ours, "references": REFERENCES})
    rows = [(f"this model ({counts['total']} items)", ours), *REFERENCES.items()]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  acc {r['acc']:.4f}  acc_norm {r['acc_norm']:.4f}" for name, r in rows)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    device = resolve_device(args.device, option="--device")
    loaded = load_model(args.checkpoint, dropout=0.0)
    tok = tokenizer_from_meta(loaded.tokenizer)
    check_tokenizer(tok)  # before a download that would be for nothing
    if tok.vocab_size > loaded.model.config.vocab_size:
        raise UserError(f"{loaded.description}: the tokenizer has {tok.vocab_size} ids but the model only "
                        f"{loaded.model.config.vocab_size}; use a model trained with this tokenizer")
    items = load_items(args.data, args.limit)
    model = loaded.model.to(device)
    dtype = "float32" if args.dtype == "auto" else args.dtype
    print(f"hellaswag: {loaded.description}; {len(items)} items from {args.data or HF_DATASET}; "
          f"{device}, {dtype}", file=sys.stderr, flush=True)
    counts = evaluate_hellaswag(model, items, tok, batch_size=args.batch_size,
                                autocast_ctx=lambda: autocast(device, DTYPE_BY_NAME[dtype]), progress=True)
    metrics = hellaswag_metrics(counts)
    print(report(loaded.description, counts, metrics, args.json))
    return 0


if __name__ == "__main__":
    errors.start_up_done()  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    run_cli(main, oom_fix="lower --batch-size, or score a smaller model")
