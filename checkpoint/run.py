"""A training run's checkpoints: who owns the out_dir, whether to resume, and saving and restoring every
stateful part by the same mapping (torchtitan's Checkpointer).

    lock = claim_out_dir(out_dir)                      # one trainer per out_dir; leftovers of killed ones go
    resume = decide_resume(out_dir, mode="auto", ...)  # a Resume, or None for a fresh run
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

from errors import UserError, short_error
from fileio import check_writable_dir, recover_replaced_dir
from locks import DirLock, remove_temp, stale_temps, temps_of
from ownership import OUT_DIR, check_target, mark

from .format import (
    BEST_NAME, CKPT_NAME, SCHEMA, SHARDED_BEST_NAME, SHARDED_CKPT_NAME, find_checkpoint, load_checkpoint,
    save_checkpoint,
)
from .sharded import SHARDED_ENTRIES, is_sharded_checkpoint, load_into

LOCK_NAME = ".train.lock"


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


# ------------------------------------------------------------------------------------------ the out_dir

def claim_out_dir(out_dir: Path, say: Callable[[str], None] = print) -> DirLock:
    """One trainer per out_dir (rank 0 holds the lock): a second one would write the same checkpoints.
    The new holder then removes what writers killed mid-save left behind (their temp files and temp
    directories: each is a whole checkpoint), and says so in one line. An out_dir is no other command's
    folder, lies in none and holds none (ownership.py); it says what it is by its marker."""
    check_target(out_dir, OUT_DIR, "train.out_dir")
    check_writable_dir(out_dir, "train.out_dir")
    lock = DirLock(out_dir, LOCK_NAME)
    holder = lock.try_acquire()
    if holder is not None:
        raise UserError(f"another trainer (pid {holder.get('pid')} on host {holder.get('host')}, since "
                        f"{holder.get('since')}) is writing to {out_dir}; wait for it or stop it, or use another "
                        "--train.out_dir")
    mark(out_dir, OUT_DIR)
    for name in (SHARDED_CKPT_NAME, SHARDED_BEST_NAME):  # a sharded save killed between its two renames
        recover_replaced_dir(out_dir / name)
    stale = stale_temps(out_dir)
    # under the lock no one else writes this out_dir's checkpoints: a temp of their names is an orphan whatever
    # pid its name carries (reused, or alive again under an older name without its start time)
    seen = {path for path, _ in stale}
    stale += [t for t in temps_of(out_dir, (CKPT_NAME, BEST_NAME, SHARDED_CKPT_NAME, SHARDED_BEST_NAME))
              if t[0] not in seen]
    for path, _ in stale:
        remove_temp(path)
    if stale:
        size = sum(n for _, n in stale)
        say(f"removed {len(stale)} leftover temp file{'s' if len(stale) > 1 else ''} from a killed run "
            f"({size / 1e6:.1f} MB)")
    return lock


# ------------------------------------------------------------------------------------------ resuming

@dataclass
class Resume:
    """The checkpoint a run continues from, with what set-up reads of it before restoring."""
    path: Path
    payload: dict[str, Any]

    @property
    def train(self) -> dict[str, Any]:
        """The saved counters ({} if damaged: restoring reports it, naming the entry)."""
        train = self.payload.get("train")
        return train if isinstance(train, dict) else {}

    @property
    def tokenizer(self) -> dict[str, Any] | None:
        return self.payload.get("tokenizer")

    @property
    def config(self) -> dict[str, Any]:
        return self.payload.get("config") or {}

    @property
    def sharded(self) -> bool:
        """A sharded checkpoint: its model and optimizer are not in the payload; restore loads them in place."""
        return is_sharded_checkpoint(self.path)


def decide_resume(out_dir: Path, *, mode: str, config_conflicts: Callable[[dict], list[str]],
                  gather: Callable[[Any], list[Any]], other_files: Iterable[str] = ()) -> Resume | None:
    """The checkpoint to resume from (mode "auto": out_dir's ckpt.pt, when there), or None for a fresh run.

    Refused in one line: earlier files with mode "never"; earlier files (best.pt, `other_files` such as
    metrics.jsonl) but no ckpt.pt; a config that changed where it may not (`config_conflicts` lists the
    keys); a best.pt of another run. Every rank must see the same checkpoint (an out_dir shared by all
    nodes): `gather` collects each rank's outcome, and any difference or error stops every rank with
    the same line."""
    ckpt_path = find_checkpoint(out_dir, CKPT_NAME) or out_dir / CKPT_NAME
    resume, outcome = None, None
    earlier = [name for name in (CKPT_NAME, SHARDED_CKPT_NAME, BEST_NAME, SHARDED_BEST_NAME, *other_files)
               if (out_dir / name).exists()]
    try:
        if earlier and mode == "never":
            raise UserError(f"{out_dir} holds an earlier run's {', '.join(earlier)} and train.resume=never refuses to "
                            "overwrite them; use --train.resume=auto to continue that run, or a new --train.out_dir")
        if earlier and not ckpt_path.exists():
            raise UserError(f"{out_dir} holds an earlier run's {', '.join(earlier)} but no {CKPT_NAME} to resume it; "
                            "a new run there would overwrite them: use a new --train.out_dir, or move those files away")
        if ckpt_path.exists():
            resume = Resume(ckpt_path, load_checkpoint(ckpt_path))
            check_counters(resume)
            conflicts = config_conflicts(resume.config)
            if conflicts:
                raise UserError(f"cannot resume {ckpt_path}: the config changed in {'; '.join(conflicts)}; "
                                "restore those values, or train into a new --train.out_dir")
            check_best_belongs_to(find_checkpoint(out_dir, BEST_NAME), resume.train.get("run_id"))
            outcome = ("checkpoint", resume.train.get("run_id"), resume.train.get("iter"))
        else:
            outcome = ("fresh",)
    except UserError as e:
        outcome = ("error", str(e))
    seen = gather(outcome)
    errors = [o[1] for o in seen if o[0] == "error"]
    if errors:
        raise UserError(errors[0])
    differ = [r for r, o in enumerate(seen) if o != seen[0]]
    if differ:
        def what(o):
            return "no checkpoint" if o[0] == "fresh" else f"run {o[1]} at iter {o[2]}"
        raise UserError(f"rank(s) {differ} see {what(seen[differ[0]])} in {ckpt_path} but rank 0 sees {what(seen[0])}; "
                        "every rank must read and write the same train.out_dir: put it on a filesystem shared by "
                        "all nodes")
    return resume


def check_counters(resume: Resume) -> None:
    """The saved step and token counts are counts (>= 0): a damaged one would be refused later, deep in the
    loop and without naming the checkpoint (the loader's "step must be >= 0")."""
    for key in ("iter", "tokens_seen"):
        value = resume.train.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"checkpoint {resume.path}: its 'train' entry is malformed ({key} {value!r} is not a count "
                            ">= 0); use another checkpoint (e.g. best.pt), or a new --train.out_dir")


def check_best_belongs_to(best: Path | None, run_id: str | None) -> None:
    """The best-checkpoint rule: a run writes best.pt when val loss improves on ITS best, so a best.pt of
    another run would be replaced by a worse model; it must be this run's."""
    if best is None or not best.exists() or run_id is None:  # no run id: the restore reports the damaged entry
        return
    other = load_checkpoint(best).get("train", {}).get("run_id")
    if other != run_id:
        raise UserError(f"{best} belongs to another run ({other}) than this out_dir's latest checkpoint ({run_id}); resuming "
                        "could replace it with a worse model: move it away, or train into a new --train.out_dir")


# ------------------------------------------------------------------------------------------ save / restore

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
                    kept = (f"no checkpoint was written yet, so there is nothing to resume; free some space, then rerun "
                            f"with a new --train.out_dir (or move {self.latest.parent / 'metrics.jsonl'} away first)")
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
            except UserError as e:  # a part's own check of a value (the loader's "step must be >= 0"): say whose
                if str(where) in str(e):
                    raise
                raise UserError(f"checkpoint {where}: its {name!r} entry is malformed ({str(e).split('; ')[0]}); "
                                "use another checkpoint (e.g. best.pt), or a new --train.out_dir") from None
            except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as e:
                raise UserError(f"checkpoint {where}: its {name!r} entry is malformed ({short_error(e, 120)}); "
                                "use another checkpoint (e.g. best.pt), or a new --train.out_dir") from None
