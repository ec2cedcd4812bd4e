"""The model card (README.md) of an HF export: what the model is, what it was trained on, how well and how.

Everything comes from the checkpoint itself (its model_config, its resolved training config and its run
counters) and from the run's metrics.jsonl beside it (the val loss and bits/byte of the eval at the
checkpoint's step). What a checkpoint does not hold is written as "not recorded", never guessed.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Collection

import yaml

from fileio import json_loads
from model.gpt import GPT
from settings import finite_number  # (math.isfinite raised on an int of 400 digits: a traceback)

METRICS_NAME = "metrics.jsonl"
MAX_METRICS_BYTES = 64 * 2**20  # a bound on what the card reads of metrics.jsonl
MAX_CONFIG_CHARS = 256 * 1024  # a resolved config as JSON; train.py's are a few KB (its prompts and paths bounded)
MAX_LINE = 64 * 2**10
NOT_RECORDED = "not recorded"

LOAD = {
    "gpt2": ("GPT-2 (`GPT2LMHeadModel`)", ""),
    "llama": ("Llama (`LlamaForCausalLM`): rotary embeddings, RMSNorm and a SwiGLU MLP", ""),
    "qwen3": ("Qwen3 (`Qwen3ForCausalLM`): Llama's blocks with QK-norm", ""),
    "smallgpt": ("smallgpt's own modeling code (`modeling_smallgpt.py`, in this directory): no transformers "
                 "architecture expresses this model exactly", ", trust_remote_code=True"),
}


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(str(text).split())[:200]
    return text.replace("|", "\\|")


def _table(rows: dict[str, Any]) -> list[str]:
    return ["| field | value |", "|---|---|", *(f"| `{_cell(k)}` | {_cell(v)} |" for k, v in rows.items())]


def eval_at(metrics: Path, iteration: Any) -> dict[str, Any] | None:
    """The last eval record (one with val/loss) of metrics.jsonl at `iteration`, or None. Bounded:
    at most MAX_METRICS_BYTES are read, over-long or broken lines are skipped."""
    found = None
    if not metrics.is_file():  # absent, or a folder or a FIFO (which would block the read)
        return None
    try:
        with open(metrics, "rb") as f:
            data = f.read(MAX_METRICS_BYTES)
    except OSError:
        return None
    for line in data.splitlines():
        if len(line) > MAX_LINE:
            continue
        try:
            record = json_loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            continue
        if isinstance(record, dict) and record.get("iter") == iteration and isinstance(record.get("val/loss"), (int, float)):
            found = record
    return found


def _number(value: Any, fmt: str) -> str:
    return format(value, fmt) if finite_number(value) else NOT_RECORDED


def _wall_time(elapsed: Any) -> str | None:
    """A run's wall time, None when not recorded. A run that saved a checkpoint spent more than 0 s (its set-up
    counts): 0 is format.upgrade's value for a version 1 checkpoint, which kept none."""
    if not finite_number(elapsed) or elapsed <= 0:
        return None
    return f"{elapsed:.0f} s" if elapsed >= 10 else f"{elapsed:.1f} s"  # (not "0 s" for a run of 0.4 s)


def _count(value: Any, least: int = 1) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= least else None


def _decisions(plan: dict) -> dict[str, Any]:
    """What the run decided at start-up that a reader of the card would ask (training/plan.py): the config's
    value where it named one, else what the run chose (dtype auto, a measured batch, a time budget's steps).
    A decision the plan lacks (older checkpoints, a CPU run's kernel) is None."""
    micro, accum = _count(plan.get("micro_batch")), _count(plan.get("accum"))
    return {"dtype": plan.get("dtype"), "attention kernel": plan.get("attention"),
            "LM head's weight gradient by": plan.get("loss_product"),
            "micro-batch (sequences per rank)": micro, "micro-steps per step (all ranks)": accum,
            "sequences per step": micro * accum if micro and accum else None,
            "steps planned": _count(plan.get("max_iters")), "warm-up steps": _count(plan.get("warmup_iters"), 0)}


def tokenizer_words(tokenizer: dict, files: Collection[str]) -> str:
    """The exported tokenizer and the files that carry it, in words (the card's line and the export's):
    told from `files`, the names the export writes. A BPE trained on the corpus (data.tokenizer bpe:<n>) is
    its own tokenizer.json; GPT-2's is GPT-2's own vocab.json and merges.txt. (A character-level
    checkpoint is refused before anything is written: no HF tokenizer reproduces its vocabulary.)"""
    name = _cell(tokenizer.get("tokenizer"))
    if "tokenizer.json" in files:
        return f"a byte-level BPE trained on the run's corpus ({name}), in tokenizer.json (HF tokenizers' format)"
    return f"GPT-2's BPE ({name}), in GPT-2's own vocab.json and merges.txt"


def model_card(model: GPT, fmt: str, tokenizer: dict, checkpoint: dict | None, source: str | os.PathLike | None,
               name: str, vocab_size: int, files: Collection[str]) -> str:
    """README.md's text. `checkpoint`: the loaded checkpoint dict (None for a model from an HF directory);
    `source`: where it came from; `name`: the export directory's name; vocab_size: the exported rows;
    `files`: the names of the other files the export writes (its tokenizer's among them)."""
    cfg = model.config
    arch, remote = LOAD[fmt]
    n_params = sum(p.numel() for p in model.parameters())
    ckpt = checkpoint or {}
    train_state = ckpt.get("train") if isinstance(ckpt.get("train"), dict) else {}
    config = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else {}
    plan = ckpt.get("plan") if isinstance(ckpt.get("plan"), dict) else {}
    it = train_state.get("iter")
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation", f"tags: [smallgpt, {fmt}]", "---", "",
             f"# {name}", "",
             f"A decoder-only transformer of {n_params / 1e6:.2f}M parameters, trained with smallgpt and exported by "
             f"`python -m checkpoint.export` from `{_cell(str(source or '?'))}`" + (f" at step {it}." if isinstance(it, int) else ".")
             + (f" Its vocabulary, padded to {cfg.vocab_size} rows for GPU speed, is cut here to the tokenizer's "
                f"{vocab_size}: no id the tokenizer can decode is lost." if cfg.vocab_size > vocab_size else ""), "",
             f"Architecture: {arch}. Tokenizer: {tokenizer_words(tokenizer, files)}. Its logits equal "
             "smallgpt's to float32 rounding.", "",
             "```python", "from transformers import pipeline", "",
             f'pipe = pipeline("text-generation", model="{name}"{remote})',
             'print(pipe("ROMEO:")[0]["generated_text"])  # sample.py\'s defaults: temperature 0.8, top-k 200',
             "```", "",
             f"`generation_config.json` caps a sequence at the context of {cfg.block_size} tokens, prompt included.", ""]

    lines += ["## Results", ""]
    record = eval_at(Path(source).parent / METRICS_NAME, it) if checkpoint is not None and source else None
    if record is not None:
        lines += [f"At step {it}: val loss **{_number(record.get('val/loss'), '.4f')}** nats/token, "
                  f"**{_number(record.get('val/bpb'), '.4f')}** bits/byte (train loss "
                  f"{_number(record.get('eval/train_loss'), '.4f')}), from the run's {METRICS_NAME}."]
    else:
        lines += [f"Val loss and bits/byte at this step: not recorded (no eval at step {it} in a {METRICS_NAME} "
                  "beside the checkpoint)."]
    if "best_val_loss" in train_state:
        lines += ["", f"Best val loss of the run so far: {_number(train_state.get('best_val_loss'), '.4f')}."]
    lines += [""]

    lines += ["## Model", "", *_table(dataclasses.asdict(cfg)), ""]

    data = config.get("data")
    lines += ["## Data", ""]
    lines += [*_table(data), ""] if isinstance(data, dict) else ["Not recorded in the checkpoint.", ""]

    lines += ["## Training", ""]
    if train_state:
        # the counters are in "train"; what the run decided at start-up is in "plan" since format 3, where
        # format.upgrade moves an older checkpoint's too
        done = {"steps": it, "tokens seen": train_state.get("tokens_seen"),
                "wall time": _wall_time(train_state.get("elapsed_s")), "run id": train_state.get("run_id"),
                **_decisions(plan)}
        lines += [*_table({k: NOT_RECORDED if v in (None, "") else v for k, v in done.items()}), ""]
    size = len(json.dumps(config, default=str)) if config else 0
    if size > MAX_CONFIG_CHARS:  # a 200 MB run name took 4 minutes to dump, whole, into README.md
        lines += [f"The resolved training config is left out: it is {size:,} characters, over the {MAX_CONFIG_CHARS:,} of "
                  "any config train.py writes (a damaged or edited checkpoint?).", ""]
    elif config:
        try:
            text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True).rstrip()
        except yaml.YAMLError:  # a foreign checkpoint's odd value: JSON is YAML too
            text = json.dumps(config, indent=2, default=str)
        lines += ["The resolved training config (`python train.py --config` reads it as it is):", "", "```yaml", text,
                  "```", ""]
    else:
        lines += ["Not recorded: the model came from " + (f"`{_cell(str(source))}`" if source else "memory") + ".", ""]
    return "\n".join(lines)
