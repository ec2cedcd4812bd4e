"""What a checkpoint holds, and how one file of it is written and read.

A checkpoint is a dict of tensors and plain values (numbers, strings, lists, dicts, None): no pickled
objects, so reading never runs code from the file (`torch.load(weights_only=True)`). Its entries are
SCHEMA below; a reader names the entries it needs, and a file that lacks one or holds the wrong type
is refused in one line naming the entry. The storage is a backend behind two calls, `write(path, payload)` and
`read(path)`: one file (`TorchFile`: ckpt.pt, best.pt), or a directory of shards written by every rank
(`ShardedDir`, torch.distributed.checkpoint: ckpt.dcp/, best.dcp/; checkpoint/sharded.py). The path
says which: `backend_for`.
"""
from __future__ import annotations

import math
import os
import pickle
import re
import stat
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from errors import UserError, clipped, short_error
from fileio import atomic_write, no_empty_dirs_left, open_own, path_kind, recover_replaced_dir
from ownership import BEST_NAME, CKPT_NAME
from runtime.attention import DEFAULT as DEFAULT_KERNEL, KERNELS
from runtime.precision import DTYPE_BY_NAME
from settings import ITERS, MAX_ITERS, MAX_TOKENS_PER_STEP, WARMUP_ITERS, all_of, at_least, at_most, finite_number

from .sharded import ShardedDir, is_sharded_checkpoint, sharded_name

FORMAT = "smallgpt-checkpoint"
VERSION = 4  # versions 1 to 3 are read too (upgrade below)
# CKPT_NAME: the latest complete checkpoint of a run; BEST_NAME: the one with the run's best val loss. Spelled
# in ownership.py, which recognises an out_dir by them and must stay importable without torch (data/ reads it)
SHARDED_CKPT_NAME = sharded_name(CKPT_NAME)  # ckpt.dcp/ and best.dcp/: the same, sharded (train.parallel=fsdp)
SHARDED_BEST_NAME = sharded_name(BEST_NAME)
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")


@dataclass(frozen=True)
class Entry:
    kind: type
    what: str
    inference: bool = False  # read by sample.py, eval and the export (else only by a resumed run)


# The payload, entry by entry. Training adds a stateful part by registering it under one of these names
# (training/builders.py, build_checkpointer); a name missing here is refused there, so this table is
# always the whole format.
SCHEMA: dict[str, Entry] = {
    "format": Entry(str, f"always {FORMAT!r}", inference=True),
    "version": Entry(int, f"{VERSION}; older versions are upgraded when read", inference=True),
    "model": Entry(dict, "state_dict of the plain module (no `_orig_mod.` or `module.` prefixes)", inference=True),
    "model_config": Entry(dict, "dataclasses.asdict(GPTConfig): GPT(GPTConfig(**d)) rebuilds it", inference=True),
    "tokenizer": Entry(dict, '{"tokenizer": name, "chars": str | None}: data.tokenizer_from_meta builds it',
                       inference=True),
    "chat_template": Entry(dict, "a chat model's template: data.chat_template's to_dict(); absent otherwise",
                           inference=True),
    "config": Entry(dict, "the resolved training config, section by section"),
    "train": Entry(dict, "the run's counters (iter, best_val_loss, tokens_seen, elapsed_s, run_id)"),
    "plan": Entry(dict, "every decision the run made at start-up, and how: PLAN_FIELDS and their notes"),
    "optimizer": Entry(dict, '{"optimizers": [state_dict, ...]}, one per optimizer'),
    "scaler": Entry(dict, "the GradScaler's state ({} when disabled)"),
    "window": Entry(dict, "the log window's steps so far: check_window's fields (empty at a window's end)"),
    "loader": Entry(dict, "the batch loader's position and the tokens' fingerprint"),
    "rng": Entry(dict, '{"ranks": [streams of rank 0, rank 1, ...]}'),
}


def check_payload(obj: Any, where: str | os.PathLike, needed: tuple[str, ...] = ()) -> dict[str, Any]:
    """`obj` as a checkpoint payload: our format and a version this code reads (upgraded to this one);
    each of the `needed` entries present, of its SCHEMA type. One-line UserError otherwise. (Entries a
    reader does not need are checked where they are used: restoring a malformed one names it.)"""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise UserError(f"{where} is not a smallgpt checkpoint (no format={FORMAT!r}); pass a ckpt.pt written by train.py")
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= VERSION:
        raise UserError(f"checkpoint {where} has format version {clipped(version)}, this code reads 1 to {VERSION}; "
                        "update the code or use another checkpoint")
    obj = upgrade(obj)
    require(obj, where, needed)
    return obj


def require(obj: dict[str, Any], where: str | os.PathLike, needed: tuple[str, ...]) -> None:
    """Each of the `needed` entries is in the payload, of its SCHEMA type; else a one-line UserError."""
    for name in needed:
        if name not in obj:
            raise UserError(f"checkpoint {where} has no {name!r} entry; it was not written by train.py or is damaged: "
                            "use another checkpoint (e.g. best.pt)")
        entry = SCHEMA[name]
        if not isinstance(obj[name], entry.kind):
            raise UserError(f"checkpoint {where}: its {name!r} entry is a {type(obj[name]).__name__}, not a "
                            f"{entry.kind.__name__}; the file is damaged: use another checkpoint (e.g. best.pt)")


def upgrade(obj: dict[str, Any]) -> dict[str, Any]:
    """Version 1 kept the counters at the top level, one optimizer state, rank 0's RNG streams and a
    scaler entry of None; version 2 groups the counters under "train" and has lists for the others.
    Version 2 kept the start-up decisions among the counters; version 3 has them in their own "plan".
    Version 3 kept no log window: its run logged the steps since its last record at the stop, so it resumes
    with an empty one (version 4)."""
    if obj["version"] == 1:
        obj = dict(obj)
        train = {k: obj.pop(k) for k in ("iter", "best_val_loss", "tokens_seen") if k in obj}
        train["run_id"] = obj.pop("wandb_run_id", None) or ""
        train["dtype"] = ""
        train["elapsed_s"] = 0.0  # not recorded (the model card says so); a resumed run says its clock starts at 0
        obj["train"] = train
        if "optimizer" in obj:
            obj["optimizer"] = {"optimizers": [obj["optimizer"]]}
        if "rng" in obj:
            obj["rng"] = {"ranks": [obj["rng"]]}
        if "scaler" in obj and obj["scaler"] is None:
            obj["scaler"] = {}
        obj["version"] = 2
    if obj["version"] == 2:
        obj = dict(obj)
        if isinstance(obj.get("train"), dict):
            obj["train"], obj["plan"] = plan_of_version_2(obj["train"])
        obj["version"] = 3
    if obj["version"] == 3:
        obj = {**obj, "window": dict(EMPTY_WINDOW), "version": 4}
    return obj


def plan_of_version_2(train: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the counters, the plan) of a version 2 "train" entry, whose decision fields (0 or "": none) move
    to the plan with the notes that say how they were made. A run of then made its LM head's weight
    gradient with torch.mm unless it saved another choice."""
    counters = {k: v for k, v in train.items() if k not in _V2_DECISIONS}
    plan: dict[str, Any] = {"notes": {}}

    def keep(decision: str, fields: dict[str, str], note: Any) -> None:
        values = {new: train.get(old) for old, new in fields.items()}
        if next(iter(values.values())) not in (None, "", 0):  # the first field says whether it was made
            plan.update(values)
            plan["notes"][decision] = note if isinstance(note, str) else ""
    keep("dtype", {"dtype": "dtype"}, f"dtype {train.get('dtype')}")
    train = {"loss_product": "torch.mm", **train}
    keep("loss_product", {"loss_product": "loss_product"}, f"LM head's weight gradient by {train['loss_product']}")
    micro = train.get("micro_batch")
    if isinstance(micro, int) and micro > 0 and isinstance(train.get("batch_note"), str):
        keep("batch", {"micro_batch": "micro_batch"}, train["batch_note"])  # accum: global batch // micro
    keep("schedule", {"budget_iters": "max_iters", "budget_warmup": "warmup_iters"}, train.get("budget_note"))
    return counters, plan


_V2_DECISIONS = ("dtype", "loss_product", "micro_batch", "batch_note", "budget_iters", "budget_warmup", "budget_note")

# the "plan" entry's fields, by type (check_plan)
PLAN_FIELDS = {"dtype": str, "loss_product": str, "attention": str, "micro_batch": int, "accum": int, "max_iters": int,
               "warmup_iters": int}
# and the counts' bounds: those of the config keys they are decided from (settings.py), so that a plan holds
# nothing a config could not have said. A micro-batch or a number of micro-steps is at most a step's tokens
# (a sequence is at least one token).
SEQUENCES = all_of(at_least(1), at_most(MAX_TOKENS_PER_STEP))
PLAN_BOUNDS = {"micro_batch": SEQUENCES, "accum": SEQUENCES, "max_iters": ITERS, "warmup_iters": WARMUP_ITERS}


def check_plan(state: Any) -> dict[str, Any]:
    """A saved plan, checked: a dict, its notes a dict of str, each field of its type and in its bounds
    (a TypeError or ValueError naming the field otherwise). Returned as it is.

    warmup_iters may exceed max_iters: a config may ask for that (a short test run keeps its warmup, and
    lr_at warms up over the whole run), and a plan made without a time budget records the config's pair."""
    if not isinstance(state, dict) or not isinstance(state.get("notes", {}), dict):
        raise TypeError(f"the plan should be a dict with a dict of notes, got {clipped(state, 80)}")
    for name, note in state.get("notes", {}).items():
        if not isinstance(note, str):
            raise TypeError(f"the note of {clipped(name)} should be str, got {clipped(note, 80)}")
    for name, value in state.items():
        kind = PLAN_FIELDS.get(name)
        if kind is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise TypeError(f"{name} should be {kind.__name__}, got {clipped(value)}")
    if state.get("dtype", "float32") not in DTYPE_BY_NAME:
        raise ValueError(f"dtype should be one of {', '.join(DTYPE_BY_NAME)}, got {clipped(state['dtype'])}")
    if state.get("attention", DEFAULT_KERNEL) not in (DEFAULT_KERNEL, *KERNELS):  # a KeyError at the first forward
        raise ValueError(f"attention should be one of {', '.join((DEFAULT_KERNEL, *KERNELS))}, got {clipped(state['attention'])}")
    for name, check in PLAN_BOUNDS.items():
        problem = check(state[name]) if name in state else None
        if problem:
            raise ValueError(f"{name} {problem}")
    if state.get("micro_batch", 1) * state.get("accum", 1) > MAX_TOKENS_PER_STEP:
        raise ValueError(f"micro_batch x accum = {state['micro_batch'] * state['accum']:,} sequences per step: even of one "
                         f"token each, more than the {MAX_TOKENS_PER_STEP:,} tokens any step may take")
    return state


# the "train" entry's counts: steps done (at most a config's max_iters), and tokens (at most a config's most per step)
STEPS_DONE = all_of(at_least(0), at_most(MAX_ITERS))
TOKENS_SEEN = all_of(at_least(0), at_most(MAX_ITERS * MAX_TOKENS_PER_STEP))


# the "window" entry: the steps of the log window so far (train.log_interval's), saved so that a run stopped inside a
# window and resumed logs the uninterrupted run's records. The loss sum of every rank (in rank order: each rank
# averages its own, then the ranks are averaged), and the window's wall seconds so far (rank 0's).
EMPTY_WINDOW = {"steps": 0, "loss_sums": [], "seconds": 0.0}


def check_window(state: Any) -> tuple[int, list[float], float]:
    """A saved log window, checked: (steps, the ranks' loss sums, seconds); a TypeError or ValueError naming the
    field otherwise. Its sums are finite (no checkpoint is saved after a non-finite loss: training/loop.py), there
    is one a rank when it holds steps and none but zeros when it holds none."""
    if not isinstance(state, dict):
        raise TypeError(f"the window should be a dict of steps, loss_sums and seconds, got {clipped(state, 80)}")
    missing = [k for k in EMPTY_WINDOW if k not in state]
    if missing:
        raise TypeError(f"the window has no {' or '.join(missing)}")
    steps, sums, seconds = (state[k] for k in EMPTY_WINDOW)
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(f"steps should be int, got {clipped(steps)}")
    problem = STEPS_DONE(steps)
    if problem:
        raise ValueError(f"steps {problem}")
    if not isinstance(sums, list):
        raise TypeError(f"loss_sums should be a list of numbers, got {clipped(sums)}")
    for value in sums:  # (a cross-entropy is never negative)
        if not finite_number(value) or value < 0:
            raise ValueError(f"loss_sums should hold finite numbers >= 0, got {clipped(value)}")
    if steps and not sums:
        raise ValueError(f"{steps} step(s) but no rank's loss_sums")
    if not steps and any(sums):
        raise ValueError(f"no steps but loss_sums {clipped(sums)}")
    if not finite_number(seconds) or seconds < 0:
        raise ValueError(f"seconds should be a finite number >= 0, got {clipped(seconds)}")
    return steps, [float(v) for v in sums], float(seconds)


def saved_ranks(payload: dict[str, Any]) -> int | None:
    """How many ranks wrote the checkpoint: its RNG entry holds a stream set a rank (None where it holds no list)."""
    rng = payload.get("rng")
    ranks = rng.get("ranks") if isinstance(rng, dict) else None
    return len(ranks) if isinstance(ranks, list) else None


def window_entry_problem(payload: dict[str, Any]) -> str | None:
    """The log window against the entries beside it (None: nothing wrong): no more steps than the run had taken,
    one loss sum for each rank that saved it (its RNG entry holds a stream set a rank), no more seconds than the
    run's. A hand-edited window that passes check_window alone would put a made-up train/loss in the next record."""
    window, train = payload.get("window"), payload.get("train")
    if not isinstance(window, dict) or not isinstance(train, dict):
        return None  # (what is wrong with either is said where it is restored)
    steps, sums, seconds, done = window.get("steps"), window.get("loss_sums"), window.get("seconds"), train.get("iter")
    if type(steps) is int and type(done) is int and steps > done:
        return f"its {steps} step(s) are more than the {done} the run had taken"
    ranks = saved_ranks(payload)
    if isinstance(sums, list) and sums and ranks is not None and len(sums) != ranks:
        return f"it holds {len(sums)} loss sum(s), one a rank, but {ranks} rank(s) saved it"
    elapsed = train.get("elapsed_s")
    if finite_number(seconds) and finite_number(elapsed) and elapsed > 0 and seconds > elapsed:
        return f"its {clipped(seconds)} s are more than the run's {clipped(elapsed)} s"
    return None


def train_entry_problem(train: Any, plan: Any) -> str | None:
    """What is wrong with a checkpoint's "train" entry's counts (None: nothing), `plan` its "plan" entry.
    Its iter is at most the plan's max_iters: training/loop.py's loop stops there and saves only inside it, so
    no checkpoint it writes is past its own run's end (one past it would be a hand edit, and trains nothing)."""
    if not isinstance(train, dict):
        return f"a {type(train).__name__}, not the run's counters"
    for key, check in (("iter", STEPS_DONE), ("tokens_seen", TOKENS_SEEN)):
        value = train.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{key} {clipped(value)} is not a count >= 0"
        problem = check(value)
        if problem:
            return f"{key} {problem}"
    best = train.get("best_val_loss", math.inf)  # inf: no eval yet. NaN compared below nothing: best.pt never again
    if isinstance(best, bool) or not isinstance(best, (int, float)) or math.isnan(best) or best < 0:
        return f"best_val_loss {clipped(best)} is not a loss (a number >= 0, or inf before the first eval)"
    end = plan.get("max_iters") if isinstance(plan, dict) else None
    if isinstance(end, int) and not isinstance(end, bool) and train.get("iter", 0) > end:
        return f"iter {train['iter']} is past its plan's max_iters {end}, where train.py stops"
    return None


def plan_entry(payload: dict[str, Any], where: str | os.PathLike) -> dict[str, Any]:
    """A resumed checkpoint's "plan" entry, checked ({} when it has none); one line naming it if damaged."""
    try:
        return check_plan(payload.get("plan", {}))
    except (TypeError, ValueError) as e:
        raise UserError(f"checkpoint {where}: its 'plan' entry is malformed ({short_error(e, 120)}); "
                        "use another checkpoint (e.g. best.pt), or a new --train.out_dir") from None


class Backend(Protocol):
    """Where a checkpoint's bytes go. `path` names the checkpoint (ckpt.pt, best.pt) in an out_dir."""

    def write(self, path: Path, payload: dict[str, Any]) -> None: ...

    def read(self, path: Path, needed: tuple[str, ...] = ()) -> Any: ...


def _os_error_behind(e: BaseException) -> OSError | None:
    """The OSError that `e` was raised while handling (or from), if any."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


class TorchFile:
    """One file per checkpoint: torch.save to a temp file beside it, then an atomic rename
    (fileio.atomic_write), so a reader sees the old checkpoint or the new one, never a torn one."""

    def write(self, path: Path, payload: dict[str, Any], *, follow: bool = False) -> None:
        with no_empty_dirs_left(path.parent):  # a failed write leaves none of the folders made for it
            path.parent.mkdir(parents=True, exist_ok=True)
            # (follow: a file the user named, maybe a device written straight into through a link, /dev/stdout)
            with atomic_write(path, follow=follow) as tmp, (open(tmp, "wb") if follow else open_own(tmp, "wb")) as f:
                try:
                    torch.save(payload, f)
                except RuntimeError as e:
                    # torch's zip writer turns a failed write (a full disk, a quota) into "[enforce fail at
                    # inline_container.cc] unexpected pos", raised while handling the OSError: raise that OSError,
                    # which every caller reports in one line
                    cause = _os_error_behind(e)
                    if cause is None:
                        raise
                    raise cause from None

    def read(self, path: Path, needed: tuple[str, ...] = (), *, mapped: bool = False) -> Any:
        """`mapped`: a zip's tensors mapped from the file (torch.load's mmap), read only where touched."""
        try:
            kind = os.stat(path).st_mode
            if not stat.S_ISREG(kind):  # torch.load seeks: a pipe (`<(cat ckpt.pt)`) would read as corrupt
                raise UserError(f"checkpoint {path} is not a regular file ({path_kind(path)}), and a checkpoint is read by "
                                "seeking in it; save it to a file first (e.g. cat ... > ckpt.pt) and pass that")
            with open(path, "rb") as f:
                head = f.read(4)
        except OSError as e:
            raise UserError(f"cannot read checkpoint {path} ({short_error(e)}); check the path and its permissions") from None
        if head != b"PK\x03\x04" and head[:1] != b"\x80":  # torch.save's zip, or a legacy pickle
            raise UserError(f"{path} is not a PyTorch checkpoint (neither a zip archive nor a pickle: a text file, or a "
                            "corrupt one); pass a ckpt.pt written by train.py")
        try:
            with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the error below says it all
                warnings.simplefilter("ignore")
                payload = packed(torch.load(path, map_location="cpu", weights_only=True,
                                            mmap=mapped and head == b"PK\x03\x04"))
        except pickle.UnpicklingError as e:
            if head != b"PK\x03\x04":  # a plain pickle: whether it is refused or corrupt, only the message says
                raise UserError(f"checkpoint {path} is a plain pickle that could not be read safely: one holding objects "
                                "that would run code when loaded is refused, and so is a corrupt one "
                                f"({short_error(e, 80)}); use a checkpoint written by train.py") from None
            if _unsafe_globals(path):
                raise UserError(f"checkpoint {path} contains objects that would run code when loaded, so it was "
                                "refused; use a checkpoint written by train.py") from None
            raise UserError(f"checkpoint {path} is corrupt or not a PyTorch file ({short_error(e, 120)}); "
                            "use another checkpoint, e.g. best.pt, or retrain") from None
        except (RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile, KeyError, AttributeError,
                TypeError, IndexError, RecursionError) as e:
            raise UserError(f"checkpoint {path} is corrupt or truncated ({short_error(e, 120)}); "
                            "use another checkpoint, e.g. best.pt, or retrain") from None
        odd = odd_tensor(payload)
        if odd is not None:  # torch.load takes them; every reader then failed with a traceback (.item(), a copy)
            raise UserError(f"checkpoint {path}: {odd[0]} is {odd[1]}, not a tensor that holds values; use another "
                            "checkpoint, e.g. best.pt, or retrain")
        return payload


def check_finite_weights(state: dict[str, Any], where: str | os.PathLike) -> None:
    """One line naming the first floating-point tensor of a model's state dict that holds a NaN or an inf: train.py
    never saves such weights (training/loop.py's NonFiniteGuard), a damaged file can hold them (every load, and a
    resume, whose first NaN step was blamed on the learning rate). A sharded (DTensor) weight is left to its own
    rank's steps: checking it would be a collective."""
    bad = next((name for name, t in state.items() if type(t) in (torch.Tensor, torch.nn.Parameter)
                and t.is_floating_point() and not torch.isfinite(t).all()), None)
    if bad is not None:
        raise UserError(f"checkpoint {where} has non-finite weights (NaN or inf in {bad}); use best.pt or an earlier "
                        "checkpoint")


def odd_tensor(obj: Any, where: str = "") -> tuple[str, str] | None:
    """(where, what) of the first tensor in `obj` that holds no values of its own (on the meta device) or is not a
    dense one (sparse, ...); None if every tensor is plain."""
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "meta":
            return where or "a tensor", "a meta tensor (a shape without data)"
        if obj.layout != torch.strided:
            return where or "a tensor", f"a {str(obj.layout).removeprefix('torch.')} tensor"
        return None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = odd_tensor(value, f"{where}/{key}" if where else str(key))
        if found is not None:
            return found
    return None


def packed(obj: Any) -> Any:
    """`obj` with every tensor in it contiguous. train.py writes only contiguous tensors, but a checkpoint
    edited by hand may hold a transposed view (the same values, other strides), and torch's fused CPU AdamW
    updates a non-contiguous parameter or moment wrongly (2.4 off after one step of a 4 x 3 matrix): the
    run would go on, silently wrong. A contiguous tensor is returned as it is, so tied ones stay shared."""
    if isinstance(obj, torch.Tensor):  # (a sparse one has no strides: odd_tensor refuses it, by name)
        return obj.contiguous() if obj.layout == torch.strided else obj
    if isinstance(obj, dict):
        return {k: packed(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(packed(v) for v in obj)
    return obj


def _unsafe_globals(path: Path) -> list[str]:
    """What torch.save's zip at `path` would import beyond what weights_only allows (read, never run)."""
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (RuntimeError, ValueError, OSError, pickle.UnpicklingError, zipfile.BadZipFile):
        return []


BACKEND: Backend = TorchFile()
SHARDED: Backend = ShardedDir(state_file=BACKEND)


def backend_for(path: Path) -> Backend:
    """A `.dcp` name or a DCP directory is sharded; anything else is one file."""
    return SHARDED if path.suffix == ".dcp" or is_sharded_checkpoint(path) else BACKEND


def find_checkpoint(out_dir: Path, name: str) -> Path | None:
    """The checkpoint `name` (CKPT_NAME or BEST_NAME) of a run in out_dir, single-file or sharded
    (the newer if both are there), or None. A sharded one whose replacement was killed between its two
    renames is found where it was set aside (fileio.replace_dir)."""
    found = [p for p in (out_dir / name, recover_replaced_dir(out_dir / sharded_name(name), repair=False))
             if p is not None and p.exists()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


HUB_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # what the hub's names look like: owner/name
HUB_MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2")  # GPT-2's own, bare or under GPT2_OWNER
GPT2_OWNER = "openai-community"
# what is read as a hub name (load.is_hub_name, where no such local path is): a bare name, or one under GPT2_OWNER;
# any other owner/name is a local path, so that a mistyped path never turns into a download attempt
GPT2_HUB_NAME = re.compile(rf"({GPT2_OWNER}/)?[A-Za-z0-9][\w.-]*")


def resolve_checkpoint_path(path: str | os.PathLike) -> Path:
    """A checkpoint file, a sharded checkpoint's directory, or an out_dir holding ckpt.pt or ckpt.dcp.
    Raises UserError when none exists."""
    p = Path(path).expanduser()
    if is_sharded_checkpoint(p) or (p.is_dir() and p.suffix == ".dcp"):  # an incomplete one too: ShardedDir.read
        return p  # names what it lacks (a save killed mid-write leaves an empty or partial ckpt.dcp/)
    if p.is_dir():
        f = find_checkpoint(p, CKPT_NAME)
        if f is None:
            raise UserError(f"no {CKPT_NAME} or {SHARDED_CKPT_NAME} in directory {p}; pass a checkpoint, or the out_dir "
                            "of a training run")
        return f
    if not p.exists():
        aside = recover_replaced_dir(p, repair=False) if p.suffix == ".dcp" else None
        if aside is not None:
            return aside
        missing = "is a symlink to nothing (or a loop)" if p.is_symlink() else "does not exist"
        # owner/name where no folder `owner` is here: meant for the hub, where only GPT-2's names are read
        hub = "" if p.is_symlink() or p.parent.exists() or not HUB_REPO.fullmatch(str(path)) else (
            f" (as an HF hub name, only GPT-2's models are read: {', '.join(HUB_MODELS)}, or {GPT2_OWNER}/ one "
            "of them)")
        raise UserError(f"checkpoint {p} {missing}{hub}; check the path, or train first with `python train.py`")
    return p


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any], *, follow: bool = False) -> None:
    """Write `payload` to `path` atomically; "format" and "version" are stamped in. A sharded path
    (`.dcp`) is written by every rank together (ShardedDir.write). `follow`: `path` is a file the user
    named (consolidate's --out), which may be a symlink on purpose; a run's own checkpoints never are."""
    path = Path(path)
    payload = {**payload, "format": FORMAT, "version": VERSION}
    backend = backend_for(path)
    if isinstance(backend, TorchFile):
        backend.write(path, payload, follow=follow)
    else:  # a sharded checkpoint is always a run's own folder
        backend.write(path, payload)


def load_checkpoint(path: str | os.PathLike, needed: tuple[str, ...] = ()) -> dict[str, Any]:
    """Read one of our checkpoints (a file, a sharded directory, or an out_dir holding either), checked
    against SCHEMA and upgraded to the current version. Of a sharded checkpoint, the sharded entries
    (model, optimizer) are loaded whole only when `needed`. Every problem is a one-line UserError."""
    p = resolve_checkpoint_path(path)
    return check_payload(backend_for(p).read(p, needed), p, needed)


def peek_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """load_checkpoint's payload with its model_config, without reading the weights: a sharded checkpoint's
    state.pt alone, a file's tensors mapped (TorchFile.read), so that a refusal costs no load."""
    p = resolve_checkpoint_path(path)
    backend = backend_for(p)
    obj = backend.read(p, ()) if backend is SHARDED else BACKEND.read(p, mapped=True)
    return check_payload(obj, p, ("model_config",))
