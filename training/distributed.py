"""Data parallelism from outside the model: process-group setup from torchrun's environment, the DDP
wrapper, and the few collectives the loop needs."""
from __future__ import annotations

import datetime
import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from errors import UserError


@dataclass
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# the fix for every bad launch variable: what torchrun sets, or nothing (one process)
LAUNCH_FIX = ("launch with torchrun (e.g. `torchrun --standalone --nproc-per-node=2 train.py ...`), or unset RANK, "
              "WORLD_SIZE and LOCAL_RANK to run one process")


def dist_from_env() -> DistInfo:
    """torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; without them this is a single process. Values no
    launcher sets (not integers, a rank outside the world) are refused here, before anything is built:
    further on they fail deep inside torch.distributed, or a rank that is not 0 of a world of 1 waits
    for nobody."""
    given = [k for k in ("RANK", "WORLD_SIZE") if k in os.environ]
    if not given:
        return DistInfo()
    if len(given) == 1:
        missing = "WORLD_SIZE" if given == ["RANK"] else "RANK"
        raise UserError(f"{given[0]} is set but {missing} is not; {LAUNCH_FIX}")
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK") if "LOCAL_RANK" in os.environ else 0
    if world_size < 1:
        raise UserError(f"WORLD_SIZE={world_size} must be at least 1; {LAUNCH_FIX}")
    if not 0 <= rank < world_size:
        raise UserError(f"RANK={rank} is outside 0..{world_size - 1} (WORLD_SIZE={world_size}); {LAUNCH_FIX}")
    if not 0 <= local_rank < world_size:  # a node runs at most the whole world's ranks
        raise UserError(f"LOCAL_RANK={local_rank} is outside 0..{world_size - 1} (WORLD_SIZE={world_size}); {LAUNCH_FIX}")
    return DistInfo(rank, local_rank, world_size)


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{name}={value!r} is not an integer; {LAUNCH_FIX}") from None


def check_rendezvous(info: DistInfo) -> None:
    """MASTER_ADDR and MASTER_PORT, where the ranks meet: torchrun sets both. Without them
    init_process_group fails with a traceback (or, with a port that is not a number, deep inside)."""
    if not info.enabled:
        return
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name, "").strip():
            raise UserError(f"WORLD_SIZE={info.world_size} but {name} is not set, so the ranks cannot meet; {LAUNCH_FIX}")
    port = os.environ["MASTER_PORT"].strip()
    if not (port.isdigit() and 0 < int(port) < 65536):
        raise UserError(f"MASTER_PORT={port!r} is not a port number (1..65535); {LAUNCH_FIX}")


def init_distributed(info: DistInfo, device: torch.device) -> None:
    """Make `device` this process's current GPU; under torchrun, join the process group: nccl on CUDA,
    gloo on CPU. MASTER_ADDR/PORT come from torchrun (--standalone or --rdzv-*)."""
    if info.enabled and not dist.is_initialized():
        check_rendezvous(info)  # before the GPU is touched
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not info.enabled or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size,
                            timeout=datetime.timedelta(minutes=30), **kwargs)


def destroy_distributed(healthy: bool = True) -> None:
    """Leave the process group. After a clean run every rank first waits at a barrier, so that no
    collective is still in flight when the group is torn down; after a failure nobody waits."""
    if dist.is_initialized():
        if healthy:
            dist.barrier()
        gc.collect()  # free what still references the group (DDP reducers, buckets) while it exists
        dist.destroy_process_group()


def apply_ddp(model: nn.Module, info: DistInfo, device: torch.device) -> nn.Module:
    """Wrap in DistributedDataParallel when running under torchrun; otherwise return the model unchanged."""
    if not info.enabled:
        return model
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def all_reduce_mean(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= info.world_size
    return t


def any_rank(flag: bool, info: DistInfo, group=None) -> bool:
    """True on every rank if it is True on any rank. Uses a CPU tensor, so on a gloo group no GPU sync."""
    if not info.enabled:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())


# Rank 0 may spend hours preparing a large dataset while the others wait for it on this group.
CONTROL_TIMEOUT = datetime.timedelta(hours=12)


def control_group(info: DistInfo):
    """A gloo group for CPU-side agreement between ranks (stop flags, rank 0's decisions, RNG states):
    it never waits on the GPU, and its timeout is long enough for rank 0 to prepare a large dataset."""
    if not info.enabled:
        return None
    return dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)


def broadcast_object(obj, info: DistInfo, group=None):
    """Rank 0's value on every rank (e.g. the measured dtype choice, so all ranks agree)."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def on_rank0(fn, info: DistInfo, group=None):
    """fn() on rank 0 and its result on every rank, the others waiting on `group` meanwhile (e.g.
    preparing data, downloading an eval set). A UserError on rank 0 is raised on every rank."""
    outcome = None
    if info.is_main:
        try:
            outcome = ("ok", fn())
        except UserError as e:
            outcome = ("error", str(e))
    outcome = broadcast_object(outcome, info, group)
    if outcome[0] == "error":
        raise UserError(outcome[1])
    return outcome[1]


def all_reduce_sum(t: torch.Tensor, info: DistInfo, group=None) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


def all_gather_object(obj, info: DistInfo, group=None) -> list:
    """Every rank's value, on every rank, in rank order."""
    if not info.enabled:
        return [obj]
    out: list = [None] * info.world_size
    dist.all_gather_object(out, obj, group=group)
    return out
