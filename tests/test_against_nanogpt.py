"""This project against nanoGPT's OWN code (Karpathy's model.py and train.py, as they are in
../shared/anchors/nanogpt, never a copy of them in this repository), on the CPU in float32.

The references, each read from that folder:
- the forward: nanoGPT's model.py, loaded under the module name "nanogpt_model" (it must not shadow this
  project's `model` package); its GPT with targets returns the full logits and the mean cross-entropy;
- one training step: nanoGPT's GPT.configure_optimizers (its decay groups, its AdamW) and the body of
  its train.py loop (loss.backward, clip_grad_norm_ to grad_clip, optimizer.step, zero_grad);
- the learning rate: nanoGPT's get_lr, the function def cut out of train.py's source by AST and run on
  the globals it reads (warmup_iters, lr_decay_iters, learning_rate, min_lr, math).
Ours: model/gpt.py's GPT, runtime/loss_path.py's loss, the step built by training.builders.build_trainer
(train.py's chain), training/timing/schedule.py's lr_at. Without the folder every test skips, saying so.
"""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import math
import sys

import pytest
import torch

from benchmarks.baseline import nanogpt_lr
from code_reading import NANOGPT
from model import GPT, GPTConfig
from runtime.loss_path import loss_path
from training.builders import build_trainer
from training.config.sections import Config, ModelSection, TrainSection
from training.optim import param_groups
from training.parallel.distributed import Parallel
from training.plan import RunPlan
from training.timing.schedule import lr_at

pytestmark = pytest.mark.skipif(not (NANOGPT / "model.py").is_file() or not (NANOGPT / "train.py").is_file(),
                                reason=f"nanoGPT's own code is not at {NANOGPT} (model.py, train.py)")

CPU = torch.device("cpu")
SHAPE = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=65, dropout=0.0)
# nanoGPT's MLP is nn.GELU() (the exact erf GELU); ours defaults to GPT-2's tanh form (configs/README.md's
# gelu_approximate), so our side is built with the exact one, as shakespeare_char.yaml is
EXACT_GELU = dict(gelu_approximate="none")


def nanogpt_model():
    """nanoGPT's model.py as the module "nanogpt_model" (sys.modules' "model" stays this project's)."""
    if "nanogpt_model" not in sys.modules:
        spec = importlib.util.spec_from_file_location("nanogpt_model", NANOGPT / "model.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["nanogpt_model"] = module  # its @dataclass looks its module up by name
        spec.loader.exec_module(module)
    assert sys.modules["model"].GPT is GPT  # not shadowed
    return sys.modules["nanogpt_model"]


def ours_and_theirs(bias: bool, backend: str = "sdpa", nano_flash: bool = True):
    """Our GPT (seeded init) and nanoGPT's GPT of the same shape holding the same weights. nano_flash False:
    nanoGPT's own slow path (its `attn.bias` tril buffer, the masked_fill softmax) instead of its SDPA."""
    torch.manual_seed(1234)
    ours = GPT(GPTConfig(**SHAPE, bias=bias, attn_backend=backend, **EXACT_GELU))
    with torch.no_grad():  # off GPT-2's init (zero biases, unit norm gains, tiny activations): every weight counts
        for p in ours.parameters():
            p.add_(0.1 * torch.randn(p.shape))
    ng = nanogpt_model()
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count
        theirs = ng.GPT(ng.GPTConfig(**SHAPE, bias=bias))
    if not nano_flash:
        T = SHAPE["block_size"]
        for block in theirs.transformer.h:
            block.attn.flash = False
            block.attn.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert unexpected == [] and all(k.endswith(".attn.bias") for k in missing), (missing, unexpected)
    assert [k for k in theirs.state_dict() if not k.endswith(".attn.bias")] == list(ours.state_dict())
    return ours.train(), theirs.train()


def batch(seed: int, B: int = 4):
    g = torch.Generator().manual_seed(seed)
    d = torch.randint(0, SHAPE["vocab_size"], (B, SHAPE["block_size"] + 1), generator=g)
    return d[:, :-1].contiguous(), d[:, 1:].contiguous()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("backend", ["manual", "sdpa"])
@pytest.mark.parametrize("nano_flash", [True, False], ids=["nano_sdpa", "nano_slow"])
def test_forward_logits_and_loss_equal_nanogpts(bias, backend, nano_flash):
    """nanoGPT's GPT.forward(idx, targets) -> (full logits, mean cross-entropy) against our model's logits
    and our run's loss (loss_path, as the chain makes it on a CPU), from the same weights: within 1e-5."""
    ours, theirs = ours_and_theirs(bias, backend, nano_flash)
    x, y = batch(0)
    with torch.no_grad():
        logits_ref, loss_ref = theirs(x, y)
        logits = ours(x)
        loss = loss_path(CPU, compiled=False, vocab_size=SHAPE["vocab_size"])(ours, x, y)
    assert logits.shape == logits_ref.shape == (4, SHAPE["block_size"], SHAPE["vocab_size"])
    assert (logits - logits_ref).abs().max().item() < 1e-5
    assert abs(loss.item() - loss_ref.item()) < 1e-5
    assert loss_ref.item() > 3.0  # ~ln(65) at init: a real loss, not a degenerate one


def nanogpt_steps(theirs, batches, *, lr, weight_decay, betas, grad_clip):
    """nanoGPT's optimizer (configure_optimizers, device_type 'cpu': plain AdamW, as use_fused needs cuda)
    and its loop body with gradient_accumulation_steps 1, fp32 (its GradScaler disabled, a no-op)."""
    with contextlib.redirect_stdout(io.StringIO()):
        optimizer = theirs.configure_optimizers(weight_decay, lr, betas, "cpu")
    norms = []
    for x, y in batches:
        for group in optimizer.param_groups:
            group["lr"] = lr  # as its loop sets get_lr(iter_num) before each step
        _, loss = theirs(x, y)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(theirs.parameters(), grad_clip).item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return optimizer, norms


class GivenBatches:
    """The chain's loaders: these batches, in turn (no eval batches)."""

    def __init__(self, batches):
        self.batches = batches

    def get_batch(self, i: int, micro: int = 0):
        return self.batches[i % len(self.batches)]


def test_decay_groups_equal_nanogpts():
    """Which parameters get weight decay: nanoGPT's configure_optimizers groups (by name) against ours
    (training/optim.py's param_groups), both ways: every parameter in exactly one group, the same ones decay."""
    ours, theirs = ours_and_theirs(bias=True)
    with contextlib.redirect_stdout(io.StringIO()):
        opt = theirs.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    name_of = lambda model: {id(p): n for n, p in model.named_parameters()}  # noqa: E731
    theirs_names, ours_names = name_of(theirs), name_of(ours)
    ref = [sorted(theirs_names[id(p)] for p in g["params"]) for g in opt.param_groups]
    mine = [sorted(ours_names[id(p)] for p in g["params"]) for g in param_groups(ours, 0.1)]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert mine == ref
    assert "transformer.wte.weight" in mine[0] and "lm_head.weight" not in mine[0] + mine[1]  # tied: once


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("backend", ["manual", "sdpa"])
def test_training_steps_equal_nanogpts(bias, backend):
    """Three steps (AdamW's state past its first step) with clipping active, from the same weights and
    batches and hyperparameters: nanoGPT's optimizer and loop body against our step as train.py builds it
    (build_trainer: LMLoss, train_step, make_optimizers' AdamW, fused on a CPU; fp32, no compile). The
    flavours differ (ours fused, nanoGPT's plain single-tensor AdamW on a CPU); the weights after the steps
    equal within 1e-6, and the pre-clip gradient norms within 1e-5. Each side attends the same way (our
    "manual" against nanoGPT's slow path, our "sdpa" against its SDPA): across the two, gradients differ by
    ~3e-9, which Adam's first step (~lr * g / (|g| + eps)) turns into ~1e-5 where |g| is ~1e-8."""
    lr, weight_decay, betas, grad_clip = 3e-3, 0.1, (0.9, 0.95), 0.5
    ours, theirs = ours_and_theirs(bias, backend=backend, nano_flash=backend == "sdpa")
    batches = [batch(s) for s in (1, 2, 3)]
    cfg = Config(model=ModelSection(**SHAPE, bias=bias, attn_backend=backend, **EXACT_GELU),
                 train=TrainSection(lr=lr, min_lr=lr, weight_decay=weight_decay, beta1=betas[0], beta2=betas[1],
                                    grad_clip=grad_clip, dtype="float32", compile=False, batch_size=4)).freeze()
    trainer = build_trainer(cfg, Parallel(), CPU, ours, RunPlan(), lambda micro: (GivenBatches(batches), {}),
                            say=lambda line: None)
    assert trainer.model is ours
    [our_opt] = trainer.step.optimizers
    ref_opt, ref_norms = nanogpt_steps(theirs, batches, lr=lr, weight_decay=weight_decay, betas=betas,
                                       grad_clip=grad_clip)
    assert our_opt.defaults["fused"] is True and not ref_opt.defaults["fused"] and not ref_opt.defaults["foreach"]
    norms = [trainer.step([b]).grad_norm.item() for b in batches]
    assert min(ref_norms) > grad_clip  # every step clipped, on both sides
    assert max(abs(a - b) for a, b in zip(norms, ref_norms)) < 1e-5
    C = SHAPE["n_embd"]
    theirs_sd = {k: v for k, v in theirs.state_dict().items() if not k.endswith(".attn.bias")}
    ours_sd, start = ours.state_dict(), ours_and_theirs(bias)[0].state_dict()
    for k in [k for k in ours_sd if k.endswith("attn.c_attn.bias")]:
        # The key bias (rows C..2C of c_attn's bias) adds q . b_k to every score of a query's row, which the
        # softmax cancels: its exact gradient is 0, so on either side it is rounding noise (~1e-10) that Adam
        # normalises (lr * g / (|g| + eps)). Both move < 1/10 of what a real gradient moves in 3 steps
        # (~lr each); the rest of the tensor (q and v biases) is compared below with everything else.
        for side in (ours_sd, theirs_sd):
            assert (side[k][C:2 * C] - start[k][C:2 * C]).abs().max() < 0.1 * lr * len(batches)
        ours_sd[k], theirs_sd[k], start[k] = (torch.cat([t[:C], t[2 * C:]])
                                              for t in (ours_sd[k], theirs_sd[k], start[k]))
    diff = max((v - theirs_sd[k]).abs().max().item() for k, v in ours_sd.items())
    moved = min((v - start[k]).abs().max().item() for k, v in ours_sd.items())
    assert moved > 100 * 1e-6  # every tensor moved well beyond the tolerance
    assert diff < 1e-6


def nanogpt_get_lr(**settings):
    """nanoGPT's get_lr: its def, cut out of train.py by AST, exec'd with the globals it reads."""
    tree = ast.parse((NANOGPT / "train.py").read_text(encoding="utf-8"))
    [fn] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_lr"]
    names = [n for n in ast.walk(fn) if isinstance(n, ast.Name)]
    stored = {n.id for n in names if isinstance(n.ctx, ast.Store)} | {"it"}
    free = {n.id for n in names if isinstance(n.ctx, ast.Load)} - stored
    assert free == {"warmup_iters", "lr_decay_iters", "learning_rate", "min_lr", "math"}, free
    g = {"math": math, **settings}
    exec(compile(ast.Module([fn], type_ignores=[]), "nanoGPT's train.py", "exec"), g)
    return g["get_lr"]


@pytest.mark.parametrize("lr,min_lr,warmup,iters", [(1e-3, 1e-4, 10, 60), (6e-4, 6e-5, 20, 100),
                                                    (3e-3, 3e-4, 1, 25), (1e-3, 0.0, 5, 6)])
def test_lr_schedule_against_nanogpts_get_lr(lr, min_lr, warmup, iters):
    """Our lr_at(step, max_iters=M) against nanoGPT's get_lr(it) with lr_decay_iters = M, every step of a run
    of M steps and a few past it. From step warmup_iters on they are the same cosine and floor (exactly, up
    to float rounding). In the warmup they differ, an undocumented deviation from nanoGPT: nanoGPT ramps
    lr * (it + 1) / (warmup_iters + 1) (train.py's get_lr) and first reaches lr at step warmup_iters, ours
    lr * (step + 1) / warmup_iters (schedule.py's docstring) reaches it at step warmup_iters - 1. So
    ours(s) = theirs(s) * (warmup_iters + 1) / warmup_iters in the warmup, tested exactly."""
    get_lr = nanogpt_get_lr(warmup_iters=warmup, lr_decay_iters=iters, learning_rate=lr, min_lr=min_lr)
    for it in range(iters + 5):
        ours = lr_at(it, lr=lr, min_lr=min_lr, warmup_iters=warmup, max_iters=iters)
        theirs = get_lr(it)
        if it < warmup:
            assert ours == pytest.approx(theirs * (warmup + 1) / warmup, rel=1e-12, abs=0), it
            assert ours > theirs, it  # the deviation is there: nanoGPT's ramp is one step longer
        else:
            assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-18), it
    assert lr_at(warmup - 1, lr=lr, min_lr=min_lr, warmup_iters=warmup, max_iters=iters) == lr
    assert get_lr(warmup) == lr and get_lr(iters) == pytest.approx(min_lr, abs=1e-18)
    for it in range(iters + 5):  # the benchmarks' "nanoGPT's recipe" (bench.py --only budget) uses nanoGPT's own
        assert nanogpt_lr(it, lr=lr, min_lr=min_lr, warmup_iters=warmup, lr_decay_iters=iters) == get_lr(it), it
