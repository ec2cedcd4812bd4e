"""How much memory a run will need, estimated before anything large is allocated: a run that cannot fit
stops at start with one line giving the estimate and what to lower, instead of dying in the allocator
or, worse, being killed by the kernel's OOM killer (which endangers everything else on the host).

The estimates count the big tensors and round up; they are checked against the measured peak of a
small run in the tests (tests/test_memory.py) to stay within a factor of a few. A run is refused when
its estimate exceeds 90% of what is available: MemAvailable on a CPU (per local rank), free memory on a GPU.
"""
from __future__ import annotations

import ctypes
import os

import torch

from errors import UserError
from model import GPTConfig

HEADROOM = 0.9
# per token per layer, the activations autograd keeps, in units of n_embd: the block's input and two
# norms (3), q, k, v and the attention output (4), the projection's input (1), the MLP's input, hidden
# and activated hidden (1 + 4 + 4), residual sums and dropout masks (3): ~20, plus the head's logits
ACTIVATIONS_PER_LAYER = 20


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def training_bytes(config: GPTConfig, *, batch_size: int, block_size: int, loss_chunk_rows: int | None,
                   shards: int = 1, activation_checkpointing: bool = False) -> dict[str, int]:
    """The big allocations of one training process, in fp32 (a bf16/fp16 run needs less).

    `shards` > 1 (FSDP over that many ranks): each rank keeps 1/shards of the weights, gradients and
    AdamW state, plus whole parameters and gradients while they are computed with: the root's
    (embeddings, head, final norm: gathered through the forward and the backward) and two blocks'
    (the one computing and the next one, prefetched). `activation_checkpointing`: only each block's input is kept across the
    forward, plus one block's activations while its backward recomputes them."""
    n = config.num_params()  # counted, not built
    tokens = batch_size * block_size
    C, V, L = config.n_embd, config.vocab_size, config.n_layer
    per_layer = tokens * C * ACTIVATIONS_PER_LAYER * 4
    per_layer += 0 if config.attn_backend == "sdpa" else 2 * batch_size * config.n_head * block_size ** 2 * 4
    head_rows = tokens if loss_chunk_rows is None else min(loss_chunk_rows, tokens)
    activations = (tokens * C * 4 * L + per_layer) if activation_checkpointing else per_layer * L
    out = {"weights, gradients and AdamW state": -(-4 * n * 4 // shards)}
    if shards > 1:
        root = config.num_params(blocks=False)  # embeddings, final norm, untied head
        out["gathered units (FSDP)"] = (root + 2 * (n - root) // L) * 2 * 4
    out |= {
        "activations": activations,
        "logits": head_rows * V * 4 * 3 + V * C * 4,  # logits, softmax and its gradient; the head's fp32 gradient
    }
    return out


def sampling_bytes(config: GPTConfig, *, rows: int, prompt_len: int) -> dict[str, int]:
    """sample.py: the model in fp32 and two candidates of the dtype probe, the KV cache of every row,
    the token buffer and the logits."""
    n = config.num_params()  # counted, not built
    C, L, V, S = config.n_embd, config.n_layer, config.vocab_size, config.block_size
    return {
        "weights (and the dtype probe's copies)": n * 4 * 3,
        "KV cache": 2 * L * rows * S * C * 4,
        "tokens and logits": rows * (prompt_len + S) * 9 + rows * V * 4 * 4,
    }


def available_bytes(device: torch.device) -> int | None:
    """Free memory for this process: on a GPU what the driver says is free; on a CPU MemAvailable
    (Linux) shared by the local ranks (torchrun's LOCAL_WORLD_SIZE); None where it can't be known."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    ranks = local_ranks()  # checked first: a bad value is refused even where /proc/meminfo is missing
    try:
        with open("/proc/meminfo") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
    return kb * 1024 // ranks


LOCAL_FIX = "unset LOCAL_WORLD_SIZE to run one process, or launch with torchrun, which sets it"


def local_ranks() -> int:
    """How many ranks share this machine's memory: torchrun's LOCAL_WORLD_SIZE, 1 when unset. A value no
    launcher sets is refused in one line: int() stops with a traceback on '' or 'abc', and a zero,
    negative or huge count would divide the memory into a wrong estimate (a huge one: 0 bytes free).
    Only ASCII digits are taken (int() reads ' 2', '2_0' and '٢' too, which no launcher writes); a node runs
    at most WORLD_SIZE ranks (1 when WORLD_SIZE is unset or not a number: dist_from_env names that)."""
    value = os.environ.get("LOCAL_WORLD_SIZE")
    if value is None:
        return 1
    world = os.environ.get("WORLD_SIZE", "")
    most = int(world) if world.isascii() and world.isdigit() and int(world) > 0 else 1
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= most:
        raise UserError(f"LOCAL_WORLD_SIZE={value!r} is not a number of local ranks (1..{most}: at most WORLD_SIZE, "
                        f"1 without it); {LOCAL_FIX}")
    return int(value)


def check_fits(need: dict[str, int], device: torch.device, what: str, lower: str) -> None:
    """One line if the estimate `need` is over HEADROOM of what `device` has free."""
    free = available_bytes(device)
    total = sum(need.values())
    if free is not None and total > HEADROOM * free:
        parts = ", ".join(f"{k} {gib(v)}" for k, v in sorted(need.items(), key=lambda kv: -kv[1]))
        raise UserError(f"{what} needs about {gib(total)} ({parts}) but {device.type} has {gib(free)} free; lower {lower}")


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
KEEP_BELOW = 1 << 30  # allocations up to 1 GiB come from the heap and are reused, not mapped afresh


def keep_freed_memory() -> bool:
    """Let the C allocator keep the memory a training step frees, for the next step to reuse (Linux with
    glibc; elsewhere a no-op returning False).

    A CPU step allocates and frees the same large buffers every time (a 50k-vocabulary head's logits
    chunk and weight gradient are ~25 MB each at 128 wide). By default glibc maps big blocks afresh
    with mmap, or trims the heap's top, and gives them back to the kernel when freed, so every step
    faults the pages in again and the kernel zeroes them: 2,500 to 19,000 minor page faults per step
    on the BPE step of bench.py (glibc's heuristics vary from run to run), and ~0 with this setting, at
    the same peak RSS (the step reaches that peak anyway); ~4% of the step's CPU time on a 2-core Zen 3. The cost: memory freed by the process is not returned to the OS until it exits."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, KEEP_BELOW)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):  # not glibc (macOS, musl, Windows)
        return False


def release_freed_memory() -> None:
    """Give the memory the process has freed back to the kernel now (glibc's malloc_trim; elsewhere a
    no-op): before measuring how far one call raises the peak RSS, which memory kept by
    keep_freed_memory would otherwise hide."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
