"""The checkpoint file format, and turning a checkpoint (or HF GPT-2 weights) into a model.

Training writes checkpoints through training/checkpoint.py; everything that only reads a model
(sample.py, eval/, the HF export, and training's own init_from) comes here, so inference never needs
the training package.

A checkpoint is a dict of tensors and plain Python values (numbers, strings, lists, dicts, None),
written with `torch.save` and read back with `torch.load(weights_only=True)`, so loading never runs
code from the file. Payload keys:

    format          "smallgpt-checkpoint"
    version         2 (version 1 files are read too)
    model           state_dict of the plain module (no `_orig_mod.` / `module.` prefixes)
    model_config    dataclasses.asdict(GPTConfig)  ->  GPT(GPTConfig(**d))
    config          the resolved training config as a nested dict
    tokenizer       {"tokenizer": name, "chars": str | None}  ->  data.tokenizer_from_meta(...)
    train           {"iter", "best_val_loss", "tokens_seen", "elapsed_s", "run_id", "dtype"}: the run's counters
    optimizer, scaler, loader, rng: the other training states (training/checkpoint.py registers them)
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from errors import UserError, short_error
from fileio import atomic_write

from .gpt import GPT, GPTConfig
from .hf import from_pretrained

FORMAT = "smallgpt-checkpoint"
VERSION = 2
CKPT_NAME = "ckpt.pt"
BEST_NAME = "best.pt"
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")
GPT2_TOKENIZER = {"tokenizer": "gpt2", "chars": None}


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Write `payload` to `path` atomically (fileio.atomic_write); "format" and "version" are stamped in."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as tmp, open(tmp, "wb") as f:
        torch.save({**payload, "format": FORMAT, "version": VERSION}, f)


def resolve_checkpoint_path(path: str | os.PathLike) -> Path:
    """A checkpoint file, or a directory holding ckpt.pt. Raises UserError when neither exists."""
    p = Path(path).expanduser()
    if p.is_dir():
        f = p / CKPT_NAME
        if not f.is_file():
            raise UserError(f"no {CKPT_NAME} in directory {p}; pass a checkpoint file, or the out_dir of a training run")
        return f
    if not p.exists():
        raise UserError(f"checkpoint {p} does not exist; check the path, or train first with `python train.py`")
    return p


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Load one of our checkpoints (a file, or a directory with ckpt.pt) with weights_only=True."""
    p = resolve_checkpoint_path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise UserError(f"cannot read checkpoint {p} ({short_error(e)}); check the path and its permissions") from None
    if head != b"PK\x03\x04" and head[:1] != b"\x80":  # torch.save's zip, or a legacy pickle
        raise UserError(f"{p} is not a PyTorch checkpoint (neither a zip archive nor a pickle: a text file, or a corrupt "
                        "one); pass a ckpt.pt written by train.py")
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the error below says it all
            warnings.simplefilter("ignore")
            obj = torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Weights only load failed" in str(e):
            raise UserError(
                f"checkpoint {p} contains objects that would run code when loaded, so it was refused; "
                "use a checkpoint written by train.py") from None
        raise UserError(f"checkpoint {p} is corrupt or not a PyTorch file ({short_error(e, 120)}); "
                        "use another checkpoint, e.g. best.pt, or retrain") from None
    except (RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile, KeyError, AttributeError,
            TypeError, IndexError) as e:
        raise UserError(f"checkpoint {p} is corrupt or truncated ({short_error(e, 120)}); "
                        "use another checkpoint, e.g. best.pt, or retrain") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise UserError(f"{p} is not a smallgpt checkpoint (no format={FORMAT!r}); "
                        "pass a ckpt.pt written by train.py")
    version = obj.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise UserError(f"checkpoint {p} has format version {version!r}, this code reads up to {VERSION}; "
                        "update the code or use an older checkpoint")
    return _upgrade(obj)


def _upgrade(obj: dict[str, Any]) -> dict[str, Any]:
    """Version 1 kept the counters at the top level, one optimizer state, rank 0's RNG streams and a
    scaler entry of None; version 2 groups the counters under "train" and has lists for the others."""
    if obj["version"] == 1:
        obj = dict(obj)
        train = {k: obj.pop(k) for k in ("iter", "best_val_loss", "tokens_seen") if k in obj}
        train["run_id"] = obj.pop("wandb_run_id", None) or ""
        train["dtype"] = ""
        train["elapsed_s"] = 0.0
        obj["train"] = train
        if "optimizer" in obj:
            obj["optimizer"] = {"optimizers": [obj["optimizer"]]}
        if "rng" in obj:
            obj["rng"] = {"ranks": [obj["rng"]]}
        if "scaler" in obj and obj["scaler"] is None:
            obj["scaler"] = {}
        obj["version"] = VERSION
    return obj


def model_from_checkpoint(ckpt: dict[str, Any], where: str | os.PathLike, **overrides: Any) -> GPT:
    """Our GPT, on the CPU, with the checkpoint's model_config (fields in `overrides` replaced, e.g.
    dropout) and its weights. A checkpoint whose config or weights don't fit gives a one-line UserError."""
    for key in ("model", "model_config"):
        if key not in ckpt:
            raise UserError(f"checkpoint {where} has no {key!r} entry; use a ckpt.pt written by train.py")
    try:
        config = GPTConfig(**{**ckpt["model_config"], **overrides})
    except (TypeError, ValueError) as e:
        raise UserError(f"checkpoint {where} has an invalid model_config ({short_error(e, 120)}); "
                        "use a ckpt.pt written by this version of train.py") from None
    with torch.device("meta"):  # no point initialising weights that load_state_dict overwrites
        model = GPT(config)
    try:
        # a plain dict: assign=True records itself in a state dict's _metadata, which would make every
        # later load_state_dict of the checkpoint's dict replace parameters instead of copying into them
        model.load_state_dict(dict(ckpt["model"]), assign=True)
    except (RuntimeError, TypeError, AttributeError) as e:
        raise UserError(f"checkpoint {where}: weights do not match its model_config ({short_error(e, 120)}); "
                        "use an intact ckpt.pt") from None
    model.tie_weights()  # assign=True replaced the tied tensor; tie again
    return model


def model_config_dict(model: GPT) -> dict[str, Any]:
    return dataclasses.asdict(model.config)


# ------------------------------------------------------------------------------ any model, by name

@dataclass
class LoadedModel:
    model: GPT  # on the CPU, fp32, eval mode
    tokenizer: dict[str, Any]  # {"tokenizer", "chars"}: data.tokenizer_from_meta(...) builds it
    description: str  # one line for the user: where it came from
    checkpoint: dict[str, Any] | None = None  # the whole checkpoint, for our own files


def is_hub_name(spec: str) -> bool:
    """A bare name ("gpt2", "gpt2-medium", "distilgpt2") or openai-community/...; anything else with a
    slash is a local path, so a mistyped path never turns into a download attempt."""
    if Path(spec).expanduser().exists() or spec.lower().endswith(CHECKPOINT_SUFFIXES):
        return False
    return bool(re.fullmatch(r"(openai-community/)?[A-Za-z0-9][\w.-]*", spec))


def is_hf_dir(spec: str) -> bool:
    path = Path(spec).expanduser()
    return path.is_dir() and not (path / CKPT_NAME).is_file() and (path / "config.json").is_file()


def load_model(spec: str, **overrides: Any) -> LoadedModel:
    """A checkpoint file, a training out_dir, an HF GPT-2 directory or an HF hub name -> LoadedModel.
    `overrides` replace model_config fields (e.g. dropout=0.0). Every bad input is a one-line UserError."""
    if is_hf_dir(spec) or is_hub_name(spec):
        return _load_hf(spec, **overrides)
    ckpt = load_checkpoint(spec)
    where = resolve_checkpoint_path(spec)
    model = model_from_checkpoint(ckpt, where, **overrides)
    bad = next((name for name, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()),
               None)
    if bad is not None:  # train.py never saves such weights; a damaged or foreign file can hold them
        raise UserError(f"checkpoint {where} has non-finite weights (NaN or inf in {bad}); use best.pt or an earlier "
                        "checkpoint")
    if "tokenizer" not in ckpt:
        raise UserError(f"checkpoint {where} has no 'tokenizer' entry; use a ckpt.pt written by train.py")
    it = ckpt["train"].get("iter") if isinstance(ckpt.get("train"), dict) else None
    desc = f"{where}" + (f" (iter {it})" if isinstance(it, int) else "")
    return LoadedModel(model.eval(), ckpt["tokenizer"], desc, ckpt)


def _load_hf(spec: str, **overrides: Any) -> LoadedModel:
    try:
        model = from_pretrained(spec, **overrides)
    except FileNotFoundError as e:
        raise UserError(f"cannot load {spec!r}: {' '.join(str(e).split())[:160]}; pass a checkpoint file, "
                        "a training out_dir, or an HF GPT-2 directory") from None
    except (ValueError, KeyError, TypeError, OSError) as e:  # bad config.json or weights
        raise UserError(f"{spec} is not a usable HF GPT-2 directory ({short_error(e)}); "
                        "re-export it or pass another path") from None
    except Exception as e:  # e.g. safetensors' own errors on a damaged file
        raise UserError(f"cannot read the HF GPT-2 weights in {spec} ({type(e).__name__}); "
                        "re-export or re-download them") from None
    return LoadedModel(model.eval(), dict(GPT2_TOKENIZER), f"HF GPT-2 {spec}")
