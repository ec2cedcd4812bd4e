"""GPT(config) on the meta device: its parameters' shapes and dtypes, with no storage and no values. load.py
fills one with a checkpoint's tensors (load_state_dict(assign=True)), hf.py checks an HF directory's tensors
against one and then fills it with them (cast to fp32, made contiguous), and a sharded resume materialises one
shard by shard (training/builders.py).

Built under torch.device("meta") alone, the modules' random init still runs on the meta tensors: it draws
nothing, but torch's meta normal_ imports torch._dynamo on its first call, ~0.9 s of every sample.py, chat.py
and serve.py start-up (2.6 s in all for small.yaml's checkpoint on a 2-core EPYC Zen 5). Here the init is
skipped where its tensor is a meta one: there are no values to draw.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from model import GPT, GPTConfig

_DRAWS = (torch.Tensor.normal_, torch.Tensor.uniform_)  # GPT.init_weights calls these on each tensor


class _NoInitOnMeta(TorchFunctionMode):
    """torch.nn.init's functions and the tensor draws above return a meta tensor as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensor = args[0] if args else kwargs.get("tensor")  # nn.init passes its tensor by keyword
        if (func in _DRAWS or getattr(func, "__module__", "") == "torch.nn.init") and isinstance(tensor, torch.Tensor) \
                and tensor.is_meta:
            return tensor
        return func(*args, **kwargs)


def meta_model(config: GPTConfig) -> GPT:
    """GPT(config) with every parameter on the meta device, its init skipped."""
    with torch.device("meta"), _NoInitOnMeta():
        return GPT(config)


def filled_model(config: GPTConfig, weights: Callable[[GPT], dict[str, torch.Tensor]], *, strict: bool = True) -> GPT:
    """GPT(config) whose parameters are the tensors `weights(model)` gives for its meta model (the caller checks
    and casts them against `model.state_dict()`'s shapes and dtypes): assigned, not copied into random ones
    (load_state_dict(assign=True)), and the tied head pointed at wte again (assign replaced the tied tensor).
    strict=False: a tied lm_head.weight may be left out. The callers' errors are their own (load.py, hf.py)."""
    model = meta_model(config)
    model.load_state_dict(weights(model), strict=strict, assign=True)
    model.tie_weights()
    return model
