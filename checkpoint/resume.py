"""Whether a training run resumes, and from what: the checkpoint every rank agrees on, or a fresh run.

    resume = decide_resume(out_dir, mode="auto", ...)  # a Resume, or None for a fresh run

A resume is refused in one line where it would not continue the same run: a config changed where it may
not, damaged counters, a best.pt of another run (the best-checkpoint rule), ranks that see different files.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from errors import UserError, clipped

from .format import (BEST_NAME, CKPT_NAME, SHARDED_BEST_NAME, SHARDED_CKPT_NAME, find_checkpoint, load_checkpoint,
                     train_entry_problem, window_entry_problem)
from .sharded import is_sharded_checkpoint


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
    def tokens_sha256(self) -> str | None:
        """The fingerprint of the tokens the run trained on (None if damaged: restoring reports it)."""
        loader = self.payload.get("loader")
        sha = loader.get("tokens_sha256") if isinstance(loader, dict) else None
        return sha if isinstance(sha, str) else None

    @property
    def sharded(self) -> bool:
        """A sharded checkpoint: its model and optimizer are not in the payload; restore loads them in place."""
        return is_sharded_checkpoint(self.path)


def earlier_files(out_dir: Path, other_files: Iterable[str] = ()) -> list[str]:
    """The names of the files in out_dir that a fresh run there refuses to overwrite (decide_resume): what a
    run that stops before its first ckpt.pt (best.pt may come first, at an eval) must tell the user to move."""
    return [name for name in (CKPT_NAME, SHARDED_CKPT_NAME, BEST_NAME, SHARDED_BEST_NAME, *other_files)
            if (out_dir / name).exists()]


def no_resume_advice(out_dir: Path, other_files: Iterable[str] = ()) -> str:
    """What to do after a run stopped before it wrote any ckpt.pt: nothing to resume, and the files it left
    would make a fresh run in the same out_dir refuse to start."""
    left = ", ".join(str(out_dir / name) for name in earlier_files(out_dir, other_files))
    return "rerun with a new --train.out_dir" + (f" (or move {left} away first)" if left else "")


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
    earlier = earlier_files(out_dir, other_files)
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
    """The saved step and token counts are counts in their bounds (format.train_entry_problem), checked here,
    where the checkpoint is read: a damaged one would otherwise reach the loop, whose batches trust their step."""
    for entry, problem in (("train", train_entry_problem(resume.train, resume.payload.get("plan"))),
                           ("window", window_entry_problem(resume.payload))):
        if problem:
            raise UserError(f"checkpoint {resume.path}: its {entry!r} entry is malformed ({problem}); use another "
                            "checkpoint (e.g. best.pt), or a new --train.out_dir")


def check_best_belongs_to(best: Path | None, run_id: str | None) -> None:
    """The best-checkpoint rule: a run writes best.pt when val loss improves on ITS best, so a best.pt of
    another run would be replaced by a worse model; it must be this run's."""
    if best is None or not best.exists() or run_id is None:  # no run id: the restore reports the damaged entry
        return
    other = load_checkpoint(best).get("train", {}).get("run_id")
    if other != run_id:
        raise UserError(f"{best} belongs to another run ({clipped(other)}) than this out_dir's latest checkpoint "
                        f"({clipped(run_id)}); resuming "
                        "could replace it with a worse model: move it away, or train into a new --train.out_dir")
