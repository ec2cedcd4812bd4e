"""Choices measured once per machine and kept, so that the same command gives the same numbers on every
run: the dtype `auto` picks on a CPU (timed per model shape), the CPU's matmul peak that MFU is
against, and the SDPA kernel a GPU trains with (runtime/attention.py, per GPU, builds and shape). A timing on a busy machine can flip a near tie (fp32 for a config alone, bf16 for the same
config under torchrun) and a peak re-probed in every process moved the MFU of one resumed run from 3.6%
to 77%; a decision made once and kept cannot.

They live in one small JSON file in the user's cache directory: $SMALLGPT_CACHE_DIR, else
$XDG_CACHE_HOME/smallgpt, else ~/.cache/smallgpt (choices.json). Each entry is keyed by what it depends
on: the machine (CPU model, ISA torch uses, native bf16, torch version, threads, and oneDNN's ISA cap where
one is set) and, for a dtype, the model's shape, the batch and the world size; for the fused loss's
weight-gradient product (runtime/loss_path.py), its shape and the chunks a step makes. Every use says
where the value came from. Delete the file to measure again; --train.dtype, sample.py --dtype and
train.peak_flops override it. A cache that cannot be read or written (a read-only home, a damaged file) is
measured around, never an error.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any, Callable

import torch

from bounded import TooLarge, read_at_most
from fileio import atomic_write_bytes, json_loads, no_empty_dirs_left

from . import precision
from .precision import DTYPE_BY_NAME, dtype_name

CACHE_ENV = "SMALLGPT_CACHE_DIR"
FILE_NAME = "choices.json"
MAX_BYTES = 1 << 20  # a bigger file is not ours (or is damaged): ignored, and rewritten


def cache_path() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "smallgpt")
    return Path(root) / FILE_NAME


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> str:
    """What a CPU measurement depends on besides the work itself. The ISA and native bf16 are in it, so
    that a run under ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 keeps its own entries."""
    # oneDNN's ISA cap alone changes its kernels (the weight-gradient product) and nothing above; DNNL_ is its old name
    caps = [f"{name}={os.environ[name]}" for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA") if os.environ.get(name)]
    return (f"{_cpu_model()} | {torch.backends.cpu.get_cpu_capability()} | native bf16 {precision.cpu_native_bf16()} | "
            f"torch {torch.__version__} | {torch.get_num_threads()} threads" + "".join(f" | {c}" for c in caps))


def _read() -> dict[str, Any] | None:
    """The cache's entries; {} where there is no file (or it can't be read); None where it is damaged:
    too big, not JSON, or JSON of another shape than an object."""
    path = cache_path()
    try:
        data = json_loads(read_at_most(path, MAX_BYTES))
    except OSError:
        return {}
    except (ValueError, TooLarge):  # (UnicodeDecodeError too)
        return None
    return data if isinstance(data, dict) else None


def _whole(entry: Any) -> bool:
    """An entry as this module writes them: an object of plain values (a damaged one, say nested a
    thousand deep, could not even be written back)."""
    return isinstance(entry, dict) and all(v is None or isinstance(v, (str, int, float)) for v in entry.values())


def _write(key: str, value: dict[str, Any]) -> bool:
    data = {k: v for k, v in (_read() or {}).items() if _whole(v)}  # damaged entries are dropped, not rewritten
    data[key] = value
    try:
        with no_empty_dirs_left(cache_path().parent):  # a failed write leaves none of the folders made for it
            cache_path().parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(cache_path(), (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    except OSError:
        return False
    return True


def _usable(hit: Any, valid: Callable[[Any], bool]) -> bool:
    """A cached entry that can be used as it is: any other JSON in any field (the file is the user's to
    edit or damage) is measured again, not looked up (an unhashable list or dict stopped a run with a
    TypeError) or printed."""
    return (_whole(hit) and "value" in hit and valid(hit["value"]) and isinstance(hit.get("when", ""), str)
            and isinstance(hit.get("note", ""), str))


def cached(kind: str, parts: dict[str, Any], measure: Callable[[], dict[str, Any]],
           valid: Callable[[Any], bool]) -> tuple[dict[str, Any], str]:
    """The entry for (kind, this machine, parts): from the cache where its "value" passes `valid` (which
    must take any JSON value), else measure() now and kept.
    -> (entry, where it came from: a clause for the note printed with it)."""
    key = json.dumps({"kind": kind, "machine": machine_key(), **parts}, sort_keys=True, default=str)
    data = _read()
    hit = None if data is None else data.get(key)
    if _usable(hit, valid):
        return hit, f"measured {hit.get('when', '?')}, from the cache {cache_path()} (delete it to measure again)"
    entry = {**measure(), "when": datetime.datetime.now().isoformat(timespec="seconds")}
    kept = _write(key, entry)
    damaged = " (the cached value was damaged)" if data is None or key in data else ""
    return entry, f"measured now{damaged}, {'kept in ' + str(cache_path()) if kept else 'not kept (the cache is not writable)'}"


def auto_dtype(kind: str, parts: dict[str, Any], choose: Callable[[], tuple[torch.dtype, str]],
               device: torch.device) -> tuple[torch.dtype, str]:
    """dtype `auto` decided once per (machine, parts) where it is timed (a CPU with native bf16), and
    then reused; elsewhere the rule needs no timing and `choose` is just called."""
    if device.type != "cpu" or not precision.cpu_native_bf16():
        return choose()

    def measure():
        dtype, note = choose()
        return {"value": dtype_name(dtype), "note": note}

    entry, source = cached(kind, parts, measure, lambda v: isinstance(v, str) and v in DTYPE_BY_NAME)
    return DTYPE_BY_NAME[entry["value"]], f"{entry.get('note', '')} ({source})"


def cpu_peak(dtype: torch.dtype, probe: Callable[[], float]) -> tuple[float, str]:
    """The CPU's matmul peak in `dtype`, probed once per machine and reused. -> (FLOP/s, where from)."""
    def valid(v):  # a bool is an int to isinstance; inf would give an MFU of 0
        return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")

    entry, source = cached("peak", {"dtype": dtype_name(dtype)}, lambda: {"value": probe()}, valid)
    return float(entry["value"]), source
