"""A training run's out_dir: one trainer at a time (its lock), and what writers killed mid-save left there.

    lock = claim_out_dir(out_dir)     # rank 0; a second trainer is refused in one line; leftovers go
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from errors import UserError
from fileio import check_writable_dir, recover_replaced_dir
from locks import DirLock, remove_temp, stale_temps, temps_of
from ownership import OUT_DIR, check_target, mark

from .format import BEST_NAME, CKPT_NAME, SHARDED_BEST_NAME, SHARDED_CKPT_NAME

LOCK_NAME = ".train.lock"


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
