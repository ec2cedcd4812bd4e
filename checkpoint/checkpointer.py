"""Saving and restoring every stateful part of a training run by the same mapping (torchtitan's Checkpointer).

    ckpt = Checkpointer(out_dir, is_main=..., sharded=False)
    ckpt.register("model", raw_model); ckpt.register("optimizer", OptimizerState(optimizers)); ...
    ckpt.restore(resume)                               # every rank; each part gets back what it saved
    ckpt.save()  /  ckpt.save(best=True)               # every rank (some parts gather); rank 0 writes

sharded=True (train.parallel=fsdp) writes ckpt.dcp/ and best.dcp/ instead of ckpt.pt and best.pt: every
rank writes its shards of the model and the optimizer, rank 0 the rest (checkpoint/sharded.py).

Restoring goes in registration order, so the RNG streams (registered last) are restored last and nothing
consumes them after. The names a part may be registered under are the file format's (format.SCHEMA).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Protocol

from errors import EntryMismatch, UserError, short_error

from .format import (BEST_NAME, CKPT_NAME, SCHEMA, SHARDED_BEST_NAME, SHARDED_CKPT_NAME, check_finite_weights,
                     save_checkpoint)
from .resume import Resume, no_resume_advice
from .sharded import SHARDED_ENTRIES, load_into


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class Checkpointer:
    def __init__(self, out_dir: str | os.PathLike, *, is_main: bool = True, sharded: bool = False):
        self.out_dir = Path(out_dir)
        self.is_main = is_main
        self.sharded = sharded  # every rank writes its shards: ckpt.dcp/, best.dcp/
        self.states: dict[str, Stateful] = {}
        self.static: dict[str, Any] = {}  # written with every checkpoint, read only to build the run
        self.last_saved_iter: int | None = None  # the iteration the latest ckpt.pt holds (written or restored)

    @property
    def latest(self) -> Path:
        return self.out_dir / (SHARDED_CKPT_NAME if self.sharded else CKPT_NAME)

    @property
    def best(self) -> Path:
        return self.out_dir / (SHARDED_BEST_NAME if self.sharded else BEST_NAME)

    def register(self, name: str, state: Stateful) -> None:
        """A stateful part, saved and restored under `name` (one of format.SCHEMA's entries)."""
        self._check_name(name)
        self.states[name] = state

    def register_static(self, name: str, value: Any) -> None:
        """A value written with every checkpoint that the run does not restore (it built the run from it)."""
        self._check_name(name)
        self.static[name] = value

    def _check_name(self, name: str) -> None:
        if name not in SCHEMA or name in ("format", "version") or name in self.states or name in self.static:
            raise ValueError(f"cannot register {name!r}: add it to checkpoint.format.SCHEMA once, under a new name")

    def save(self, iter_num: int, *, best: bool = False) -> None:
        """Collect every state (on every rank: some gather across ranks), then rank 0 writes ckpt.pt (or
        best.pt); sharded, every rank writes its shards of ckpt.dcp/ (best.dcp/). A failed write is a
        one-line UserError naming the last good checkpoint."""
        path = self.best if best else self.latest
        payload = {name: obj.state_dict() for name, obj in self.states.items()}
        if self.is_main or self.sharded:
            try:
                save_checkpoint(path, {**self.static, **payload})
            except OSError as e:  # a full disk, a quota, a read-only mount: the files written before are intact
                if self.last_saved_iter is not None:
                    kept = (f"the last checkpoint, {self.latest}, still holds iter {self.last_saved_iter}; free some "
                            "space, then rerun the same command to resume")
                else:  # nothing to resume, and the log it left would make the same out_dir refuse a fresh run
                    kept = ("no checkpoint was written yet, so there is nothing to resume; free some space, then "
                            + no_resume_advice(self.out_dir, ("metrics.jsonl",)))
                raise UserError(f"cannot write {path} ({short_error(e)}); {kept}") from None
        if not best:
            self.last_saved_iter = iter_num

    def restore(self, resume: Resume) -> None:
        """Give every registered state its saved entry (restore_states), and remember the iteration the
        checkpoint holds as the last one saved. A sharded checkpoint's model and optimizer are loaded in
        place, each rank its shards (DCP reshards to this run's ranks)."""
        ckpt, where = resume.payload, resume.path
        if resume.sharded != self.sharded:  # e.g. a checkpoint older than train.parallel, whose config lacks it
            kinds = {True: "sharded (train.parallel=fsdp)", False: "single-file (train.parallel=ddp)"}
            raise UserError(f"checkpoint {where} is {kinds[resume.sharded]} but this run writes {kinds[self.sharded]} "
                            f"checkpoints; resume with --train.parallel={'fsdp' if resume.sharded else 'ddp'}, or train "
                            "into a new --train.out_dir")
        if resume.sharded:  # the model and optimizer are loaded in place, each rank its shards (DCP reshards)
            parts = {name: obj for name, obj in self.states.items() if name in SHARDED_ENTRIES}
            state = {name: obj.state_dict() for name, obj in parts.items()}
            load_into(where, state)
            ckpt = {**ckpt, **state}
        self.restore_states(ckpt, where)
        iter_num = resume.train.get("iter")
        self.last_saved_iter = iter_num if isinstance(iter_num, int) else None

    def restore_states(self, ckpt: Mapping[str, Any], where: str | os.PathLike) -> None:
        """Give every registered state its entry of `ckpt` (a checkpoint's payload, or a snapshot of the
        states' own state_dicts). A missing or malformed entry is a one-line UserError naming it."""
        missing = [name for name in self.states if name not in ckpt]
        if "plan" in missing and "train" in self.states and not isinstance(ckpt.get("train"), dict):
            # a version 2 checkpoint keeps its plan inside "train" (format.upgrade): the damaged entry is that one
            raise UserError(f"checkpoint {where}: its 'train' entry is malformed (a {type(ckpt.get('train')).__name__}, "
                            "not the counters and the run's plan); use another checkpoint (e.g. best.pt), or a new "
                            "--train.out_dir")
        if missing:
            raise UserError(f"checkpoint {where} has no {', '.join(map(repr, missing))} entr"
                            f"{'y' if len(missing) == 1 else 'ies'}; it was not written by train.py or is damaged: "
                            "use another checkpoint (e.g. best.pt), or a new --train.out_dir")
        for name, obj in self.states.items():
            try:
                obj.load_state_dict(ckpt[name])
            except EntryMismatch as e:  # a readable entry that does not fit this run, its cause named by the part
                raise UserError(f"checkpoint {where}: {e}") from None
            except UserError as e:  # a part's own refusal of its entry: say whose
                raise UserError(f"checkpoint {where}: its {name!r} entry is malformed ({str(e).split('; ')[0]}); "
                                "use another checkpoint (e.g. best.pt), or a new --train.out_dir") from None
            except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as e:
                raise UserError(f"checkpoint {where}: its {name!r} entry is malformed ({short_error(e, 120)}); "
                                "use another checkpoint (e.g. best.pt), or a new --train.out_dir") from None
        if "model" in self.states:
            check_finite_weights(self.states["model"].state_dict(), where)
