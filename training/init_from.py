"""The weights a run starts from (`model.init_from`): its own checkpoint when resuming, fresh weights
(`scratch`, initialised by GPT.init_weights), another run's checkpoint, or HF GPT-2 weights. The last
two go through checkpoint.load_model, the loader sample.py and eval/ use too."""
from __future__ import annotations

from typing import Any

import torch

from errors import UserError, clipped
from model import GPT
from checkpoint import check_source, is_hf_dir, is_hub_name, load_model, model_from_checkpoint

from .chat import grow_vocab
from .config.sections import ARCH_KEYS, Config, ModelSection


def resumed_init_from(saved: dict[str, Any], cfg: Config, where: str) -> tuple[Config, list[str]]:
    """A resumed run's weights come from its checkpoint `where`, never from model.init_from: a different
    init_from is said in a line naming it, and the config (saved with every checkpoint, repeated by an
    export's model card) records where the weights really came from, the saved value."""
    model = saved.get("model") if isinstance(saved, dict) else None
    before = model.get("init_from") if isinstance(model, dict) else None
    if not isinstance(before, str) or before == cfg.model.init_from:
        return cfg, []
    note = (f"model.init_from={cfg.model.init_from} is not applied: this run resumes {where}, whose weights came "
            f"from {before} (the saved config keeps that); to start from {cfg.model.init_from}, train into a new "
            "--train.out_dir")
    d = cfg.to_dict()
    return Config.from_dict(d | {"model": d["model"] | {"init_from": before}}).freeze(), [note]


def check_init_from(m: ModelSection, data_tokenizer: str) -> None:
    """Before the data is prepared (which can take long): what initial_model would refuse of model.init_from
    without its weights (a path that is not there, a folder of no kind it loads, a config that is not one, a
    source trained with another tokenizer), in the same line. Its weights are read (and checked) by initial_model."""
    if m.init_from == "scratch":
        return
    hf = is_hf_dir(m.init_from) or is_hub_name(m.init_from)
    if hf:
        _check_hf_tokenizer(m.init_from, data_tokenizer)
    source = check_source(m.init_from, dropout=m.dropout, attn_backend=m.attn_backend)
    if not hf:
        _check_tokenizer(m.init_from, source, {"tokenizer": data_tokenizer})


def _check_hf_tokenizer(init_from: str, data_tokenizer: Any) -> None:
    if data_tokenizer != "gpt2":
        raise UserError(f"model.init_from={init_from} is HF GPT-2, which needs data.tokenizer=gpt2 "
                        f"(got {data_tokenizer!r}); set --data.tokenizer=gpt2")


def _check_tokenizer(init_from: str, source: Any, data: dict[str, Any]) -> None:
    """The source's tokenizer entry names the data's tokenizer (check_init_from before the data is prepared,
    initial_model after, with the same line)."""
    name = source.get("tokenizer") if isinstance(source, dict) else None
    if name != data.get("tokenizer"):
        raise UserError(f"model.init_from={init_from} was trained with tokenizer {clipped(name)}, but this data "
                        f"uses {clipped(data.get('tokenizer'))}; set data.tokenizer (and dataset) to match")


def initial_model(m: ModelSection, *, vocab_size: int, tokenizer: dict[str, Any], seed: int,
                  resume: dict[str, Any] | None = None, chat_vocab: int = 0) -> tuple[GPT, list[str]]:
    """(model on CPU in fp32, notes to print). For init_from other than scratch the architecture comes
    from the source (the chain then returns a config that says so: `m` itself is
    frozen and never changed). `chat_vocab`: the vocabulary conversations need (training/chat.py), to which
    a source's embedding grows where it does not reach."""
    runtime = {"dropout": m.dropout, "attn_backend": m.attn_backend}  # may differ from the source
    if resume is not None:
        return model_from_checkpoint(resume, "being resumed", **runtime), []

    if m.init_from == "scratch":
        if 0 < m.vocab_size < vocab_size:
            raise UserError(f"model.vocab_size={m.vocab_size} is smaller than the tokenizer's {vocab_size} ids; "
                            f"use 0 (the tokenizer's) or a padded size >= {vocab_size}")
        torch.manual_seed(seed)
        return GPT(m.gpt_config(max(m.vocab_size, vocab_size, chat_vocab))), []

    if is_hf_dir(m.init_from) or is_hub_name(m.init_from):
        _check_hf_tokenizer(m.init_from, tokenizer.get("tokenizer"))
    loaded = load_model(m.init_from, **runtime)  # a checkpoint, an out_dir, an HF directory or hub name
    notes = []
    _check_tokenizer(m.init_from, loaded.tokenizer, tokenizer)
    if loaded.tokenizer.get("chars") != tokenizer.get("chars"):  # the same tokenizer, other characters
        raise UserError(f"model.init_from={m.init_from} was trained with the char tokenizer on other characters than "
                        f"this data's: {_chars_differ(loaded.tokenizer.get('chars'), tokenizer.get('chars'))}, so its "
                        "ids would mean other characters; prepare the data the source was trained on (data.dataset), "
                        "or train from scratch")
    model, mc = loaded.model, loaded.model.config
    if m.vocab_size not in (0, mc.vocab_size):  # the weights bring their vocabulary (config_of_source records it)
        notes.append(f"model.vocab_size={m.vocab_size} is not applied: {loaded.description} has a vocabulary of "
                     f"{mc.vocab_size}, which the run keeps (and its saved config records)")
    if vocab_size > mc.vocab_size:
        raise UserError(f"the data's vocab ({vocab_size}) is larger than {loaded.description}'s ({mc.vocab_size}); "
                        "use the tokenizer the source was trained with")
    changed = [f"{k} {getattr(m, k)}->{getattr(mc, k)}" for k in ARCH_KEYS if getattr(m, k) != getattr(mc, k)]
    if changed:
        notes.append(f"architecture taken from {loaded.description}: {', '.join(changed)}")
    # the config is not changed (it is frozen): the architecture is the checkpoint's model_config, saved with
    # the weights; the config keeps what the user asked for, and resumes compare against that
    if m.block_size > mc.block_size:
        raise UserError(f"model.block_size={m.block_size} exceeds {loaded.description}'s block_size {mc.block_size}; "
                        f"set --model.block_size={mc.block_size} or less")
    notes.append(f"initialised from {loaded.description} ({model.num_params() / 1e6:.2f}M non-embedding params)")
    grown = grow_vocab(model, chat_vocab, seed)
    if grown:
        notes.append(grown)
    return model.train(), notes


def _chars_differ(source: Any, data: Any) -> str:
    """How two char vocabularies differ, in words: the characters only one has (a few), or their order."""
    source, data = (c if isinstance(c, str) else "" for c in (source, data))
    if set(source) == set(data):
        return f"the same {len(set(data))} characters, numbered in another order"
    def few(chars: set[str]) -> str:
        shown = ", ".join(repr(c) for c in sorted(chars)[:5])
        return shown + (f" and {len(chars) - 5} more" if len(chars) > 5 else "")
    parts = [f"only the data has {few(set(data) - set(source))}" if set(data) - set(source) else "",
             f"only the source has {few(set(source) - set(data))}" if set(source) - set(data) else ""]
    return f"{len(set(source))} characters against {len(set(data))} ({'; '.join(p for p in parts if p)})"
