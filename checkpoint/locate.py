"""Which checkpoint an inference script means, and which files it is made of: the default (the run under
out/ trained last) and the files an output must never overwrite. sample.py, chat.py, serve.py and
eval/inspect.py all ask here, so a `--checkpoint` means the same in each."""
from __future__ import annotations

from pathlib import Path

from errors import UserError

from .format import CHECKPOINT_SUFFIXES, CKPT_NAME, SHARDED_CKPT_NAME
from .sharded import is_sharded_checkpoint

DEFAULT_OUT = "out"  # train.py's runs go to out/<name> (configs/*.yaml set train.out_dir so)


def default_checkpoint() -> str:
    """The most recently written ckpt.pt under ./out (out/ckpt.pt or out/<run>/ckpt.pt): after
    `python train.py --config small.yaml` that is out/small. A UserError says how to train one when
    there is none."""
    found = [p for name in (CKPT_NAME, SHARDED_CKPT_NAME)  # one file, or a sharded directory (train.parallel=fsdp)
             for p in (Path(DEFAULT_OUT) / name, *Path(DEFAULT_OUT).glob(f"*/{name}")) if p.exists()]
    if not found:
        raise UserError(f"no checkpoint under {DEFAULT_OUT}/ (the default); train one with `python train.py --config "
                        "small`, or pass --checkpoint PATH")
    return str(max(found, key=lambda p: p.stat().st_mtime).parent)


def checkpoint_files(spec: str) -> list[Path]:
    """The files of the checkpoint `spec` names: the file itself; for a directory (a training out_dir,
    a sharded checkpoint, an HF GPT-2 directory), every checkpoint file in it: ckpt.pt, best.pt, the files
    of ckpt.dcp/ and best.dcp/ (and of their copies set aside mid-replace), config.json. An HF hub name
    names no local file (the hub's cache is not the user's)."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        return [path]
    if is_sharded_checkpoint(path):
        return [f for f in path.rglob("*") if f.is_file()]
    found = []
    for child in path.iterdir():
        if child.is_dir() and is_sharded_checkpoint(child):
            found += [f for f in child.rglob("*") if f.is_file()]
        elif child.suffix.lower() in CHECKPOINT_SUFFIXES or child.name == "config.json":
            found.append(child)
    return found


def checkpoint_dirs(spec: str) -> list[Path]:
    """The sharded checkpoints (folders) `spec` names: an output inside one would become part of it."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        return []
    return [d for d in (path, *path.iterdir()) if d.is_dir() and is_sharded_checkpoint(d)]
