"""float8 training of the blocks' Linear layers (train.float8), with torchao: a hardware switch applied
from outside the model, like compile and DDP.

    check_float8(t.float8, device)          # at start-up: one line where it can't run, before any work
    n = convert_to_float8(model, t.float8)  # before FSDP and the optimizers (it swaps modules in place)

torchao's Float8Linear keeps the fp32 master weight under the same name (`weight`, `bias`): the state
dict, the checkpoint and the HF export are those of a plain run, and sampling never needs torchao. Each
matmul casts its input and weight to e4m3 (the gradient of the output to e5m2) with a scale per tensor
("tensorwise") or per row ("rowwise": finer, a little slower), on the tensor cores of compute capability
8.9+ (Ada, Hopper, Blackwell). What stays in the training dtype: the embeddings, the norms, attention's
softmax, and the LM head, whose logits feed the loss directly (modded-nanogpt runs even that in float8;
the head's loss is this project's fused chunked path). The speed comes with train.compile, which fuses
the casts and scales into the neighbouring kernels; eager float8 is slower than bf16.
"""
from __future__ import annotations

import importlib.util

import torch
import torch.nn as nn

from errors import UserError

RECIPES = ("tensorwise", "rowwise")
MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.x, 12.x)
DIVISOR = 16  # torch._scaled_mm needs both dimensions of the weight to be multiples of 16


def float8_problem(recipe: str, device: torch.device, *, capability: tuple[int, int] | None = None,
                   has_torchao: bool | None = None, option: str = "train.float8") -> str | None:
    """Why `option`=`recipe` can't run on `device` (one line naming the fix), or None. `capability`
    and `has_torchao` are looked up when not given (the tests give them)."""
    if recipe == "off":
        return None
    off = f"set {option}=off" if option == "train.float8" else f"leave out {option}"
    if device.type != "cuda":
        return (f"{option}={recipe} needs a CUDA GPU of compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
                f"or later (H100, H200, L4, L40S, RTX 4090), and this run is on {device.type}; {off}")
    if capability is None:
        capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < MIN_CAPABILITY:
        return (f"{option}={recipe} needs float8 tensor cores (compute capability 8.9 or later: H100, L4, RTX "
                f"4090); {device} has {capability[0]}.{capability[1]}; {off} (bf16 is the fastest precision there)")
    if has_torchao is None:
        has_torchao = importlib.util.find_spec("torchao") is not None
    if not has_torchao:
        return f"{option}={recipe} needs torchao, which is not installed: pip install torchao (or {off})"
    return None


def check_float8(recipe: str, device: torch.device, option: str = "train.float8") -> None:
    problem = float8_problem(recipe, device, option=option)
    if problem:
        raise UserError(problem)


def convertible(module: nn.Module, fqn: str) -> bool:
    """The blocks' Linear layers whose shapes float8 matmuls take; not the LM head."""
    return (isinstance(module, nn.Linear) and fqn.startswith("transformer.h.")
            and module.in_features % DIVISOR == 0 and module.out_features % DIVISOR == 0)


def convert_to_float8(model: nn.Module, recipe: str) -> int:
    """Swap the blocks' Linear layers for torchao's Float8Linear (in place; the parameters stay the same
    objects, so call it before the optimizers are built and before FSDP). Returns how many were swapped."""
    if recipe == "off":
        return 0
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    swapped = sum(convertible(m, fqn) for fqn, m in model.named_modules())
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe), module_filter_fn=convertible)
    return swapped
