"""Checkpoint files: atomic writes, and safe loads that turn every bad file into a one-line UserError.

A checkpoint is a dict of tensors and plain Python values (numbers, strings, lists, dicts, None),
written with `torch.save` and read back with `torch.load(weights_only=True)`, so loading never runs
code from the file. Payload keys (version 1):

    format          "smallgpt-checkpoint"
    version         1
    model           state_dict of the plain module (no `_orig_mod.` / `module.` prefixes)
    model_config    dataclasses.asdict(GPTConfig)  ->  GPT(GPTConfig(**d))
    config          the resolved training config as a nested dict (training.config.Config.to_dict())
    tokenizer       {"tokenizer": name, "chars": str | None}  ->  data.tokenizer_from_meta(...)
    optimizer, scaler (None unless fp16), iter, best_val_loss, tokens_seen, loader, rng, wandb_run_id
"""
from __future__ import annotations

import os
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from errors import UserError

FORMAT = "smallgpt-checkpoint"
VERSION = 1
CKPT_NAME = "ckpt.pt"
BEST_NAME = "best.pt"


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Write `payload` to `path` atomically; "format" and "version" are stamped in.

    The bytes go to a temp file in the same directory, which is flushed and fsynced, then renamed
    over `path` with os.replace, and the directory is fsynced. A crash at any moment leaves either
    the old file or the new one, never a half-written one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {**payload, "format": FORMAT, "version": VERSION}
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the error below says it all
            warnings.simplefilter("ignore")
            obj = torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Weights only load failed" in str(e):
            raise UserError(
                f"checkpoint {p} contains objects that would run code when loaded, so it was refused; "
                "use a checkpoint written by train.py") from None
        raise UserError(f"checkpoint {p} is corrupt or not a PyTorch file ({_short(e)}); "
                        "use another checkpoint, e.g. best.pt, or retrain") from None
    except (RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile, KeyError, AttributeError,
            TypeError, IndexError) as e:
        raise UserError(f"checkpoint {p} is corrupt or truncated ({_short(e)}); "
                        "use another checkpoint, e.g. best.pt, or retrain") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise UserError(f"{p} is not a smallgpt checkpoint (no format={FORMAT!r}); "
                        "pass a ckpt.pt written by train.py")
    version = obj.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise UserError(f"checkpoint {p} has format version {version!r}, this code reads up to {VERSION}; "
                        "update the code or use an older checkpoint")
    return obj


def _short(e: BaseException) -> str:
    msg = " ".join(str(e).split()).split(". ")[0][:120]
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def model_from_checkpoint(ckpt: dict[str, Any], where: str | os.PathLike, **overrides: Any):
    """Our GPT, on the CPU, with the checkpoint's model_config (fields in `overrides` replaced, e.g.
    dropout) and its weights. A checkpoint whose config or weights don't fit gives a one-line UserError."""
    from model import GPT, GPTConfig

    for key in ("model", "model_config"):
        if key not in ckpt:
            raise UserError(f"checkpoint {where} has no {key!r} entry; use a ckpt.pt written by train.py")
    try:
        config = GPTConfig(**{**ckpt["model_config"], **overrides})
    except (TypeError, ValueError) as e:
        raise UserError(f"checkpoint {where} has an invalid model_config ({_short(e)}); "
                        "use a ckpt.pt written by this version of train.py") from None
    with torch.device("meta"):  # no point initialising weights that load_state_dict overwrites
        model = GPT(config)
    try:
        model.load_state_dict(ckpt["model"], assign=True)
    except (RuntimeError, TypeError, AttributeError) as e:
        raise UserError(f"checkpoint {where}: weights do not match its model_config ({_short(e)}); "
                        "use an intact ckpt.pt") from None
    model.lm_head.weight = model.transformer.wte.weight  # assign=True replaced the tied tensor; tie again
    return model
