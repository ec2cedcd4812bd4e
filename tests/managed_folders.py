"""A folder of each managed kind as its command leaves it (its marker, or the files that say what it is)."""
from __future__ import annotations

import json
from pathlib import Path
import ownership


def make_managed(kind: str, path: Path) -> Path:
    """A folder of `kind` as its command leaves it (its marker, or the files that say what it is)."""
    path.mkdir(parents=True)
    if kind == ownership.OUT_DIR:
        ownership.mark(path, kind)
        (path / "ckpt.pt").write_bytes(b"weights of a run")
        (path / "metrics.jsonl").write_text('{"iter": 0}\n')
    elif kind == ownership.EXPORT:
        (path / "config.json").write_text("{}")
        (path / "model.safetensors").write_bytes(b"tensors")
    elif kind == ownership.DATA:
        (path / "meta.json").write_text(json.dumps({"tokenizer": "char", "vocab_size": 65}))
        (path / "train_000.bin").write_bytes(b"tokens")
    else:
        (path / ".metadata").write_bytes(b"index")
        (path / "__0_0.distcp").write_bytes(b"shards")
    return path


KINDS = (ownership.OUT_DIR, ownership.EXPORT, ownership.DATA, ownership.CHECKPOINT)
