"""Which ranks take part in what: one parallel context (torchtitan's ParallelDims) for the whole run.

`Parallel` holds the ranks (from torchrun's environment), the mode (train.parallel: DDP, each rank the
whole model; FSDP, each rank 1/N of it), and the CPU control group. Every question of the form "which
ranks run this" is answered here, once:

    par.decide(fn)      rank 0 runs fn, every rank gets its result (or its one-line error)
    par.on_main(fn)     rank 0 runs fn and keeps its result; the others wait (and get its one-line error)
    par.broadcast(x)    rank 0's value everywhere;   par.gather(x): every rank's, in rank order
    par.any(flag)       true everywhere if true on any rank
    par.sum_(t)         in place, over the control group;   par.mean_(t): over the default (device) group
    par.step_sum_(t)    in place, over the default group, inside the step's `waiting` (its counted targets)
    with par.waiting(what): any other collective (the step's gradient reduction), named for the error line
    par.evaluates       whether this rank runs the evals' forwards (rank 0; with FSDP every rank)
    par.scores_share    whether a rank scores its own share of the HellaSwag items (else every item)
    par.wrap(model)     DDP where the ranks each hold the whole model

No other code passes a process group or compares train.parallel with a string.

A rank that stops answering ends the others: every collective waits at most train.collective_timeout
(the default group's and the control group's timeout), then each rank stops with one line naming the
collective and the step it waited in. What may legitimately take long on rank 0 alone (preparing a
large dataset, a download, rank 0's eval, a checkpoint write) is waited for on a second, patient group
(`patient=True`). While a rank waits, `waiting` says in what and since when: a SIGTERM or Ctrl-C that
arrives then ends the process within seconds (training/parallel/signals.py), instead of after the timeout.
"""
from __future__ import annotations

import datetime
import gc
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from errors import WENT_AWAY, UserError, lost_peer, said
from runtime.memory import local_ranks

T = TypeVar("T")
DDP_MODE, FSDP_MODE = "ddp", "fsdp"
MODES = (DDP_MODE, FSDP_MODE)
# Rank 0 may spend hours preparing a large dataset while the others wait for it on this group.
CONTROL_TIMEOUT = datetime.timedelta(hours=12)
MAX_WORLD_SIZE = 2**20  # ranks: far above the largest jobs run (~1e5 GPUs), far below the absurd
DEFAULT_TIMEOUT_S = 600.0  # train.collective_timeout's default ("10m")
NCCL_LATER_S = 60.0  # the device group times out this much later: the control group's one line comes first
# the fix for every bad launch variable: what torchrun sets, or nothing (one process)
LAUNCH_FIX = ("launch with torchrun (e.g. `torchrun --standalone --nproc-per-node=2 train.py ...`), or unset RANK, "
              "WORLD_SIZE and LOCAL_RANK to run one process")


@dataclass
class Parallel:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    mode: str = DDP_MODE  # train.parallel; on one rank it still sets the checkpoint's layout (FSDP: sharded)
    timeout_s: float = field(default=DEFAULT_TIMEOUT_S, compare=False)  # train.collective_timeout
    group: Any = field(default=None, compare=False, repr=False)  # the gloo control group (join)
    patient_group: Any = field(default=None, compare=False, repr=False)  # the same ranks, CONTROL_TIMEOUT
    at: str = field(default="start-up", compare=False)  # where the run is (the loop says "iter N"): for the line
    # (collective, since, grace seconds: how long a signal may wait for it to end normally): signals.py
    waiting_in: tuple[str, float, float] | None = field(default=None, compare=False)
    _mesh: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"Parallel.mode must be one of {MODES}, got {self.mode!r}")

    # ------------------------------------------------------------------------------- who takes part
    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """FSDP: sharded weights, optimizer state and checkpoints (ckpt.dcp/), on any number of ranks."""
        return self.mode == FSDP_MODE

    @property
    def shards(self) -> int:
        """Over how many ranks the weights, gradients and optimizer state are sharded (1: not sharded)."""
        return self.world_size if self.sharded else 1

    @property
    def joint_forward(self) -> bool:
        """Every rank takes part in each forward (FSDP on several ranks gathers each block's weights)."""
        return self.sharded and self.enabled

    @property
    def evaluates(self) -> bool:
        """Whether this rank runs the evals' forwards: rank 0 reports, and with FSDP every rank joins in."""
        return self.is_main or self.joint_forward

    @property
    def scores_share(self) -> bool:
        """Whether each rank scores its own share of a per-item eval (HellaSwag). With a joint forward the
        shares could need different numbers of forwards and hang the gathers: every rank scores every item."""
        return not self.joint_forward

    @property
    def ddp_buckets(self) -> bool:
        """DDP's fp32 gradient buckets exist (several ranks, each holding the whole model)."""
        return self.enabled and not self.sharded

    # ------------------------------------------------------------------------------- lifecycle
    def join(self, device: torch.device) -> None:
        """Make `device` this process's current GPU; under torchrun, join the process group (nccl on CUDA,
        gloo on CPU) and make the control group. MASTER_ADDR/PORT come from torchrun."""
        if self.enabled and not dist.is_initialized():
            check_rendezvous(self)  # before the GPU is touched
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not self.enabled:
            return
        timeout = datetime.timedelta(seconds=self.timeout_s)
        if not dist.is_initialized():
            # NCCL's watchdog aborts the process at its timeout (a C++ dump, not our line): it gets a minute
            # more than the gloo groups, where the CPU blocks first and says which collective it waited in
            kwargs = {"device_id": device} if device.type == "cuda" else {}
            later = datetime.timedelta(seconds=NCCL_LATER_S if device.type == "cuda" else 0)
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", rank=self.rank,
                                    world_size=self.world_size, timeout=timeout + later, **kwargs)
        # CPU-side agreement (stop flags, rank 0's decisions, RNG states) never waits on the GPU; the patient
        # group's timeout is long enough for rank 0 to prepare a large dataset
        self.group = dist.new_group(backend="gloo", timeout=timeout)
        self.patient_group = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)

    @contextmanager
    def waiting(self, what: str, patient: bool = False, grace_s: float = 2.0) -> Iterator[None]:
        """Around a collective: says what this rank waits in (for a signal that arrives meanwhile: it ends
        the process if the wait goes on `grace_s` longer), and turns a timeout, or a peer that went away,
        into one line naming the collective and the step."""
        if not self.enabled:
            yield
            return
        self.waiting_in = (what, time.monotonic(), grace_s)
        try:
            yield
        except RuntimeError as e:  # gloo and NCCL raise no type of their own: errors.lost_peer tells
            why = lost_peer(e)
            if why is None:
                raise
            if why == WENT_AWAY:
                how = "went away"
            else:
                limit = "the patient group's 12 h" if patient else f"train.collective_timeout={self.timeout_s:g}s"
                how = f"did not answer within {limit} (it hangs or is far behind)"
            raise said(UserError(f"rank {self.rank} stopped at {self.at}: another rank {how} in {what}; what was saved "
                                 "is kept: find the stuck rank's error above, then rerun the same command to resume")) from None
        finally:
            self.waiting_in = None

    def mesh(self, device: torch.device):
        """The device mesh FSDP shards over: one dimension, every rank (made once, on first use). Imported
        here, not at the top: DTensor's modules cost ~1 s of every start-up that does not shard."""
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(device.type, (self.world_size,))
        return self._mesh

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        """The step's module: DDP where several ranks each hold the whole model; FSDP shards in place
        (training/parallel/sharding.py), so its module is used as it is."""
        if not self.ddp_buckets:
            return model
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    # ------------------------------------------------------------------------------- collectives
    def broadcast(self, obj: T, what: str = "a broadcast from rank 0", patient: bool = False) -> T:
        """Rank 0's value on every rank (e.g. the measured dtype choice, so all ranks agree). `patient`: the
        others may wait for rank 0 long (its eval, a checkpoint write), on the patient group."""
        if not self.enabled:
            return obj
        box = [obj]
        # a patient wait is rank 0's long work: a signal then stops the run after it, as between steps
        with self.waiting(what, patient, grace_s=math.inf if patient else 2.0):
            dist.broadcast_object_list(box, src=0, group=self.patient_group if patient else self.group)
        return box[0]

    def decide(self, fn: Callable[[], T], what: str = "rank 0's decision", patient: bool = False) -> T:
        """fn() on rank 0 and its result on every rank, the others waiting meanwhile (`patient` for what may
        take long: preparing data, a download). A UserError on rank 0 is raised on every rank."""
        return self.broadcast(self.on_main(fn, what, patient), what, patient)

    def on_main(self, fn: Callable[[], T], what: str = "rank 0's work", patient: bool = False) -> T | None:
        """fn() on rank 0, its result there and None on the others, which wait for it. A UserError on rank 0
        is raised on every rank. (What only rank 0 holds, such as the out_dir's lock.)"""
        result, error = None, None
        if self.is_main:
            try:
                result = fn()
            except UserError as e:
                error = str(e)
        error = self.broadcast(error, what, patient)
        if error is not None:
            raise UserError(error)
        return result

    def gather(self, obj: T, what: str = "a gather of every rank's value") -> list[T]:
        """Every rank's value, on every rank, in rank order."""
        if not self.enabled:
            return [obj]
        out: list = [None] * self.world_size
        with self.waiting(what):
            dist.all_gather_object(out, obj, group=self.group)
        return out

    def any(self, flag: bool, what: str = "the ranks' stop flags") -> bool:
        """True on every rank if it is True on any rank. A CPU tensor: on the gloo group, no GPU sync."""
        if not self.enabled:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        with self.waiting(what):
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def sum_(self, t: torch.Tensor, what: str = "a sum over the ranks") -> torch.Tensor:
        """`t` summed over the ranks, in place (a CPU tensor: the control group)."""
        if self.enabled:
            with self.waiting(what):
                dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t

    def step_sum_(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the ranks, in place, on the default (device) group, with no host sync: a collective
        of the training step (its counted targets), so it runs inside the step's own `waiting` (step_at)."""
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def mean_(self, t: torch.Tensor, what: str = "the logged loss's mean over the ranks") -> torch.Tensor:
        """`t` averaged over the ranks, in place, on the default group (a device tensor: the loss)."""
        if self.enabled:
            with self.waiting(what):
                dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t /= self.world_size
        return t


def dist_from_env(mode: str = DDP_MODE, timeout_s: float = DEFAULT_TIMEOUT_S) -> Parallel:
    """torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; without them this is a single process. Values no
    launcher sets (not integers, a rank outside the world) are refused here, before anything is built:
    further on they fail deep inside torch.distributed, or a rank that is not 0 of a world of 1 waits
    for nobody."""
    given = [k for k in ("RANK", "WORLD_SIZE") if k in os.environ]
    if not given:
        local_ranks()  # read later by the memory check: refused here, before any data is prepared
        return Parallel(mode=mode, timeout_s=timeout_s)
    if len(given) == 1:
        missing = "WORLD_SIZE" if given == ["RANK"] else "RANK"
        raise UserError(f"{given[0]} is set but {missing} is not; {LAUNCH_FIX}")
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK") if "LOCAL_RANK" in os.environ else 0
    if world_size < 1:
        raise UserError(f"WORLD_SIZE={world_size} must be at least 1; {LAUNCH_FIX}")
    if world_size > MAX_WORLD_SIZE:  # rank 0 would wait for ranks that no launch starts
        raise UserError(f"WORLD_SIZE={world_size} is more ranks than any launch starts (at most {MAX_WORLD_SIZE:,}); "
                        f"{LAUNCH_FIX}")
    if not 0 <= rank < world_size:
        raise UserError(f"RANK={rank} is outside 0..{world_size - 1} (WORLD_SIZE={world_size}); {LAUNCH_FIX}")
    if not 0 <= local_rank < world_size:  # a node runs at most the whole world's ranks
        raise UserError(f"LOCAL_RANK={local_rank} is outside 0..{world_size - 1} (WORLD_SIZE={world_size}); {LAUNCH_FIX}")
    local_ranks()
    return Parallel(rank, local_rank, world_size, mode, timeout_s)


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{name}={value!r} is not an integer; {LAUNCH_FIX}") from None


def check_rendezvous(par: Parallel) -> None:
    """MASTER_ADDR and MASTER_PORT, where the ranks meet: torchrun sets both. Without them
    init_process_group fails with a traceback (or, with a port that is not a number, deep inside)."""
    if not par.enabled:
        return
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name, "").strip():
            raise UserError(f"WORLD_SIZE={par.world_size} but {name} is not set, so the ranks cannot meet; {LAUNCH_FIX}")
    port = os.environ["MASTER_PORT"].strip()
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):  # isdigit() alone passes '²', which int() refuses
        raise UserError(f"MASTER_PORT={port!r} is not a port number (1..65535); {LAUNCH_FIX}")


def destroy_distributed(healthy: bool = True, par: Parallel | None = None) -> None:
    """Leave the process group. After a clean run every rank first waits at a barrier (on `par`'s patient
    group: rank 0 may still be finishing wandb), so that no collective is still in flight when the group is
    torn down; after a failure nobody waits."""
    if dist.is_initialized():
        if healthy:
            if par is not None:
                with par.waiting("the ranks' last barrier", patient=True, grace_s=math.inf):
                    dist.barrier(group=par.patient_group)
            else:
                dist.barrier()
        gc.collect()  # free what still references the group (DDP reducers, buckets) while it exists
        dist.destroy_process_group()
        if par is not None:
            # par's own handles on its groups, freed now too: kept until the interpreter's teardown, a gloo
            # group's destructor ran there and aborted rank 0 ("terminate called without an active exception")
            # after a finished 2-rank run, in 3 of 5 full test runs
            par.group = par.patient_group = par._mesh = None
            gc.collect()
