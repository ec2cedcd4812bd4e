"""Inference asks here for a model: from one of our checkpoints (a file or a training out_dir), an HF
GPT-2 directory, or an HF hub name. sample.py, chat.py, serve.py, eval/, the HF export and training's
init_from all load through `load_model` (the scripts through `load_for_inference`: no dropout, the
tokenizer built and checked against the model), so inference never needs the training package."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from data import Tokenizer, tokenizer_from_meta
from data.chat_template import ChatTemplate
from errors import UserError, clipped, short_error
from model.gpt import GPT, GPTConfig

from .format import (
    CHECKPOINT_SUFFIXES, CKPT_NAME, GPT2_HUB_NAME, check_finite_weights, load_checkpoint, peek_checkpoint, require,
    resolve_checkpoint_path, train_entry_problem,
)
from .hf import Refused, check_pretrained, from_pretrained
from .hf_chat import read_back
from .meta import filled_model
from .model_config import model_config_problem
from .sharded import is_sharded_checkpoint, load_whole, model_shapes

GPT2_TOKENIZER = {"tokenizer": "gpt2", "chars": None}


def model_from_checkpoint(ckpt: dict[str, Any], where: str | os.PathLike, **overrides: Any) -> GPT:
    """Our GPT, on the CPU, with the checkpoint's model_config (fields in `overrides` replaced, e.g.
    dropout) and its weights. A checkpoint whose config or weights don't fit gives a one-line UserError.
    A sharded checkpoint read without its weights (load_checkpoint's `needed` without "model") has them read
    here, each claim checked against the shape of the model they go into: one meta model a load."""
    sharded = "model" not in ckpt and is_sharded_checkpoint(Path(where))
    for key in ("model_config",) if sharded else ("model", "model_config"):
        if key not in ckpt:
            raise UserError(f"checkpoint {where} has no {key!r} entry; use a ckpt.pt written by train.py")
    config = checked_model_config(ckpt["model_config"], where, **overrides)

    def weights(model: GPT) -> dict[str, Any]:  # of the meta model: no point initialising what is overwritten
        if sharded:
            ckpt["model"] = load_whole(Path(where), "model", model_shapes(model))
        # a plain dict: assign=True records itself in a state dict's _metadata, which would make every
        # later load_state_dict of the checkpoint's dict replace parameters instead of copying into them
        return in_model_dtypes(dict(ckpt["model"]), model.state_dict(), where)

    try:
        model = filled_model(config, weights)
    except (RuntimeError, TypeError, AttributeError) as e:
        raise UserError(f"checkpoint {where}: weights do not match its model_config ({short_error(e, 120)}); "
                        "use an intact ckpt.pt") from None
    return model


def in_model_dtypes(weights: dict[str, Any], expected: dict[str, torch.Tensor], where: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's floating-point weights in the model's dtypes (fp32; training casts in autocast). With
    assign=True a weight keeps the file's dtype: an fp16 checkpoint (one edited by hand, or saved by other
    code) trained on in fp16 under a plan that says float32, 19x slower and with a higher loss. A weight that
    is not floating point (an integer, a bool, a complex tensor) is no weight of this model: one line."""
    for name, value in weights.items():
        if isinstance(value, torch.Tensor) and name in expected and not value.is_floating_point():
            raise UserError(f"checkpoint {where}: weight {clipped(name, 80)} is {str(value.dtype).removeprefix('torch.')}, not "
                            "floating point; use an intact ckpt.pt")
    return {k: v.to(expected[k].dtype) if isinstance(v, torch.Tensor) and k in expected else v for k, v in weights.items()}


def checked_model_config(saved: Any, where: str | os.PathLike, **overrides: Any) -> GPTConfig:
    """The GPTConfig of a checkpoint's model_config entry (fields in `overrides` replaced), checked
    (checkpoint/model_config.py); one line if it is not one."""
    try:
        config = GPTConfig(**{**saved, **overrides})
        problem = model_config_problem(config)
    except TypeError as e:  # a field GPTConfig does not have; an entry that is not a dict
        problem = short_error(e, 120)
    if problem:
        raise UserError(f"checkpoint {where} has an invalid model_config ({problem}); "
                        "use a ckpt.pt written by this version of train.py")
    return config


def model_config_dict(model: GPT) -> dict[str, Any]:
    return dataclasses.asdict(model.config)


# ------------------------------------------------------------------------------ any model, by name

@dataclass
class LoadedModel:
    model: GPT  # on the CPU, fp32, eval mode
    tokenizer: dict[str, Any]  # {"tokenizer", "chars"}: data.tokenizer_from_meta(...) builds it
    description: str  # one line for the user: where it came from
    checkpoint: dict[str, Any] | None = None  # the whole checkpoint, for our own files
    chat_template: ChatTemplate | None = None  # a fine-tuned chat model's (ckpt["chat_template"]); None otherwise

    @cached_property
    def tok(self) -> Tokenizer:
        return tokenizer_from_meta(self.tokenizer)


def is_hub_name(spec: str) -> bool:
    """No such local path, and the shape of format.GPT2_HUB_NAME: a bare name ("gpt2", "gpt2-medium",
    "distilgpt2") or openai-community/...; anything else with a slash is a local path."""
    if Path(spec).expanduser().exists() or spec.lower().endswith(CHECKPOINT_SUFFIXES):
        return False
    return bool(GPT2_HUB_NAME.fullmatch(spec))


def is_hf_dir(spec: str) -> bool:
    path = Path(spec).expanduser()
    # config.json of any kind (a FIFO, a broken link): from_pretrained names what it is
    return path.is_dir() and not (path / CKPT_NAME).is_file() and os.path.lexists(path / "config.json")


def load_model(spec: str, **overrides: Any) -> LoadedModel:
    """A checkpoint file, a training out_dir, an HF GPT-2 directory or an HF hub name -> LoadedModel.
    `overrides` replace model_config fields (e.g. dropout=0.0). Every bad input is a one-line UserError."""
    if is_hf_dir(spec) or is_hub_name(spec):
        return _load_hf(spec, **overrides)
    where = resolve_checkpoint_path(spec)
    # a sharded checkpoint's weights are read by model_from_checkpoint, into the shapes of the model it builds
    ckpt = load_checkpoint(where, needed=("model_config",) if is_sharded_checkpoint(where) else ("model", "model_config"))
    model = model_from_checkpoint(ckpt, where, **overrides)
    check_finite_weights(model.state_dict(), where)
    _check_entries(ckpt, where)
    it = ckpt["train"].get("iter") if isinstance(ckpt.get("train"), dict) else None
    desc = f"{where}" + (f" (iter {it})" if isinstance(it, int) else "")
    return LoadedModel(model.eval(), ckpt["tokenizer"], desc, ckpt, chat_template_of(ckpt, where, model))


def _check_entries(ckpt: dict[str, Any], where: Path) -> None:
    """The entries beside the weights that a load reads: the tokenizer, the counters."""
    require(ckpt, where, ("tokenizer",))
    problem = train_entry_problem(ckpt["train"], ckpt.get("plan")) if "train" in ckpt else None
    if problem:  # its iter is printed, and kept by an export's model card
        raise UserError(f"checkpoint {where}: its 'train' entry is malformed ({problem}); use another checkpoint "
                        "(e.g. best.pt)")


def check_source(spec: str, **overrides: Any) -> dict[str, Any] | None:
    """What load_model(spec, **overrides) would refuse, in the same line, without loading the weights into memory:
    a path that is not there, a directory of no kind it loads, a config that is not one, a checkpoint's damaged
    entries, and of one of our checkpoint files its weights too (mapped from the file, not read into memory:
    missing, of other shapes, not finite). An HF directory's weight file is opened, not read; a sharded
    checkpoint's shards are read by the load. Returns the tokenizer entry of one of our checkpoints (None for HF
    GPT-2, whose tokenizer is gpt2's)."""
    if is_hf_dir(spec) or is_hub_name(spec):
        with _hf_refusals(spec):
            check_pretrained(spec, **overrides)
        return None
    where = resolve_checkpoint_path(spec)
    ckpt = peek_checkpoint(where)
    if is_sharded_checkpoint(where):  # its shards are read by the load
        checked_model_config(ckpt["model_config"], where, **overrides)
    else:  # its tensors are mapped: the model holds the file's pages, not copies (its config checked first)
        check_finite_weights(model_from_checkpoint(ckpt, where, **overrides).state_dict(), where)
    _check_entries(ckpt, where)
    return ckpt["tokenizer"]


def chat_template_of(ckpt: dict[str, Any], where: Path, model: GPT) -> ChatTemplate | None:
    """The template a fine-tuned chat model was trained with, None for a model that only continues text.
    A damaged entry, or marker ids the model has no rows for, is a one-line UserError."""
    if ckpt.get("chat_template") is None:
        return None
    try:
        template = ChatTemplate.from_dict(ckpt["chat_template"])
    except UserError as e:
        raise UserError(f"checkpoint {where}: {e}") from None
    if template.vocab_size > model.config.vocab_size:
        raise UserError(f"checkpoint {where}: its chat template's markers take ids up to {template.vocab_size - 1} but "
                        f"the model has only {model.config.vocab_size} rows; re-run the fine-tuning (sft.yaml)")
    return template


def load_for_inference(spec: str) -> LoadedModel:
    """What sample.py, chat.py, serve.py and eval/inspect.py load: `load_model` without dropout, with the
    tokenizer (`.tok`) built and known to fit the model's vocabulary."""
    loaded = load_model(spec, dropout=0.0)
    tok = loaded.tok
    if tok.vocab_size > loaded.model.config.vocab_size:
        raise UserError(f"{loaded.description}: the tokenizer has {tok.vocab_size} ids but the model only "
                        f"{loaded.model.config.vocab_size}; use a model trained with this tokenizer")
    template = loaded.chat_template
    if template is not None and template.base != tok.vocab_size:  # below: markers would be ids of text
        raise UserError(f"{loaded.description}: its chat template puts <|system|> at id {template.base}, but the "
                        f"markers start right above the {tok.name} tokenizer's {tok.vocab_size} ids; the chat_template "
                        "entry is damaged: use another checkpoint or fine-tune again")
    return loaded


def _load_hf(spec: str, **overrides: Any) -> LoadedModel:
    with _hf_refusals(spec):
        model = from_pretrained(spec, **overrides)
    tokenizer, chat = read_back(Path(spec).expanduser()) if not is_hub_name(spec) else (None, None)
    where = Path(spec)
    return LoadedModel(model.eval(), tokenizer or dict(GPT2_TOKENIZER), f"HF GPT-2 {spec}", None,
                       chat_template_of({"chat_template": chat}, where, model))


@contextmanager
def _hf_refusals(spec: str) -> Iterator[None]:
    """What reading the HF GPT-2 directory (or hub name) `spec` raises, as one line naming it."""
    try:
        yield
    except FileNotFoundError as e:
        raise UserError(f"cannot load {spec!r}: {' '.join(str(e).split())[:160]}; pass a checkpoint file, "
                        "a training out_dir, or an HF GPT-2 directory") from None
    except UserError:  # already one line naming the file (fileio's bounded reader)
        raise
    except Refused as e:  # its message names its own fix
        raise UserError(f"{spec} is not a usable HF GPT-2 directory: {' '.join(str(e).split())}") from None
    except (ValueError, KeyError, TypeError, OSError) as e:  # bad config.json or weights
        raise UserError(f"{spec} is not a usable HF GPT-2 directory ({short_error(e)}); "
                        "re-export it or pass another path") from None
    except Exception as e:  # e.g. safetensors' own errors on a damaged file
        raise UserError(f"cannot read the HF GPT-2 weights in {spec} ({type(e).__name__}); "
                        "re-export or re-download them") from None
