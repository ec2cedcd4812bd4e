"""The project's Muon (training/optim.py) against independent references: the polar factor U V^T from
an SVD, a textbook Newton-Schulz iteration written out here in fp64, torch.optim.Muon's update; its
state round-trips bitwise; and its Newton-Schulz dtype follows the device's native bf16."""
from __future__ import annotations

import io
import math

import pytest
import torch

import runtime.precision
from model import GPT, GPTConfig
from training.optim import NS_COEFFICIENTS, Muon, make_optimizers, newton_schulz
from runtime.loss_path import LMLoss
from training.step import train_step


def textbook_newton_schulz(G: torch.Tensor, steps: int, a: float, b: float, c: float) -> torch.Tensor:
    """X <- a X + b (X X^T) X + c (X X^T)^2 X in fp64, one matrix at a time, from X = G / ||G||_F,
    on the transposed matrix when G is tall."""
    X = G.double()
    if X.shape[0] > X.shape[1]:
        return textbook_newton_schulz(G.T, steps, a, b, c).T
    X = X / torch.linalg.matrix_norm(X)
    for _ in range(steps):
        A = X @ X.T
        X = a * X + b * (A @ X) + c * (A @ A @ X)
    return X


@pytest.mark.parametrize("shape", [(32, 48), (48, 32), (40, 40)])
def test_newton_schulz_converges_to_the_polar_factor_of_the_svd(shape):
    G = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    polar = newton_schulz(G, steps=60, coefficients=(1.5, -0.5, 0.0))  # the classic cubic iteration
    torch.testing.assert_close(polar, U @ Vh, rtol=0, atol=1e-10)


@pytest.mark.parametrize("shape", [(32, 48), (48, 32)])
def test_muons_five_quintic_steps_keep_the_svds_directions_and_bring_singular_values_near_one(shape):
    """Muon's own setting: U^T O V is diagonal (same singular vectors as G), with entries in [0.6, 1.2]."""
    G = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    U, _, Vh = torch.linalg.svd(G.double(), full_matrices=False)
    O = newton_schulz(G).double()  # fp32, 5 steps
    core = U.T @ O @ Vh.T
    diag = torch.diagonal(core)
    assert (core - torch.diag(diag)).abs().max() < 1e-4
    assert 0.6 < diag.min() and diag.max() < 1.2


def test_newton_schulz_in_fp32_matches_the_textbook_iteration_in_fp64_and_batches_alike():
    gen = torch.Generator().manual_seed(2)
    mats = [torch.randn(24, 64, generator=gen) for _ in range(3)]
    batched = newton_schulz(torch.stack(mats))
    for G, got in zip(mats, batched):
        want = textbook_newton_schulz(G, 5, *NS_COEFFICIENTS)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)
        torch.testing.assert_close(newton_schulz(G), got, rtol=0, atol=1e-6)  # one at a time: the same
    low = newton_schulz(mats[0], dtype=torch.bfloat16)  # bf16 iterations, returned in the input's dtype
    assert low.dtype == torch.float32
    torch.testing.assert_close(low.double(), textbook_newton_schulz(mats[0], 5, *NS_COEFFICIENTS), rtol=0, atol=0.1)


def test_a_muon_step_is_the_written_out_update_and_torch_optim_muons():
    gen = torch.Generator().manual_seed(3)
    w0 = torch.randn(16, 8, generator=gen, dtype=torch.float64)
    grads = [torch.randn(16, 8, generator=gen, dtype=torch.float64) for _ in range(2)]
    lr, m, wd = 0.02, 0.9, 0.1
    p = torch.nn.Parameter(w0.clone())
    opt = Muon([p], lr=lr, momentum=m, weight_decay=wd, ns_dtype=torch.float64)
    ref = torch.nn.Parameter(w0.clone())
    torch_opt = torch.optim.Muon([ref], lr=lr, momentum=m, weight_decay=wd)
    w, buf = w0.clone(), torch.zeros_like(w0)
    for g in grads:
        p.grad, ref.grad = g.clone(), g.clone()
        opt.step()
        torch_opt.step()
        buf = m * buf + (1 - m) * g
        update = textbook_newton_schulz((1 - m) * g + m * buf, 5, *NS_COEFFICIENTS)
        w = w * (1 - lr * wd) - lr * math.sqrt(16 / 8) * update
    torch.testing.assert_close(p.detach(), w, rtol=0, atol=1e-12)
    torch.testing.assert_close(p.detach(), ref.detach(), rtol=0, atol=1e-3)  # torch's runs bf16 iterations
    # the same state: a torch.optim.Muon checkpoint (an earlier version of this project) loads into ours
    assert torch.equal(opt.state[p]["momentum_buffer"], torch_opt.state[ref]["momentum_buffer"])
    again = Muon([torch.nn.Parameter(w0.clone())], lr=lr, momentum=m, weight_decay=wd, ns_dtype=torch.float64)
    again.load_state_dict(torch_opt.state_dict())
    assert torch.equal(next(iter(again.state.values()))["momentum_buffer"], opt.state[p]["momentum_buffer"])


def _modern_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=29, dropout=0.0,
                         pos_embedding="rope", qk_norm=True, mlp_act="relu2"))


def _steps(model, optimizers, batches):
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    amp = lambda: torch.autocast("cpu", enabled=False)  # noqa: E731
    return [train_step(model, LMLoss(), optimizers, scaler, [b], amp=amp, grad_clip=1.0).loss.item() for b in batches]


def test_muon_ns_steps_reaches_the_newton_schulz_iteration():
    """train.muon_ns_steps sets how many iterations each Muon step runs: the update equals the textbook
    quintic iteration written here, run that many times on the Nesterov momentum."""
    from training.config.sections import load_config
    from training.builders import build_optimizers

    cfg = load_config(["--config", "shakespeare_char_modern", "--train.muon_ns_steps=2", "--train.weight_decay=0"])
    model = _modern_model()
    opts = build_optimizers(model, cfg.train, torch.device("cpu"))
    opts[0].ns_dtype = torch.float64  # bf16 on CPUs that have it natively: the plumbing is what is tested here
    p = model.transformer.h[0].attn.c_proj.weight
    before = p.detach().clone()
    p.grad = torch.randn_like(p)
    for other in model.parameters():
        if other is not p:
            other.grad = None
    opts[0].step()
    a, b, c = 3.4445, -4.7750, 2.0315
    g = p.grad.double() * (1 - 0.85) + 0.85 * (p.grad.double() * (1 - 0.85))  # nesterov on a fresh buffer
    X = g / g.norm()
    for _ in range(2):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    expected = before.double() - cfg.train.muon_lr * X
    torch.testing.assert_close(p.detach().double(), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("split", [True, False])
def test_muon_orthogonalises_q_k_and_v_separately_when_split(split):
    """train.muon_split_qkv: c_attn's update is the textbook iteration (fp64, written in this file) run on
    the q, k and v rows one by one, each scaled as a square matrix; without it, on the whole (3C, C) matrix
    scaled by sqrt(3). The other matrices are unchanged by the switch."""
    from training.builders import build_optimizers
    from training.config.sections import load_config

    cfg = load_config(["--config", "shakespeare_char_modern", "--train.weight_decay=0",
                       f"--train.muon_split_qkv={str(split).lower()}"])
    model = _modern_model()
    opts = build_optimizers(model, cfg.train, torch.device("cpu"))
    opts[0].ns_dtype = torch.float64
    attn, proj = model.transformer.h[0].attn.c_attn.weight, model.transformer.h[0].mlp.c_proj.weight
    before = {w: w.detach().clone() for w in (attn, proj)}
    gen = torch.Generator().manual_seed(5)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen) if p in opts[0].pieces else None
    opts[0].step()
    m, lr = cfg.train.muon_momentum, cfg.train.muon_lr

    def update(g):  # Nesterov on a fresh buffer, then the textbook iteration
        return textbook_newton_schulz(g.double() * (1 - m) * (1 + m), 5, *NS_COEFFICIENTS)

    C = attn.shape[1]
    if split:
        expected = torch.cat([update(attn.grad[i * C:(i + 1) * C]) for i in range(3)])
    else:
        expected = math.sqrt(3) * update(attn.grad)
    torch.testing.assert_close(attn.detach().double(), before[attn].double() - lr * expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(proj.detach().double(), before[proj].double() - lr * update(proj.grad),
                               rtol=0, atol=1e-6)
    assert "pieces" not in opts[0].state_dict()["param_groups"][0]  # the state stays torch.optim.Muon's


def test_muon_takes_param_groups_like_torch_optim_muon():
    p, q = torch.nn.Parameter(torch.randn(6, 4)), torch.nn.Parameter(torch.randn(4, 4))
    opt = Muon([{"params": [p]}, {"params": [q], "lr": 0.01}], pieces=[2, 1])
    assert [g["lr"] for g in opt.param_groups] == [0.02, 0.01]
    assert opt.pieces == {p: 2, q: 1}
    with pytest.raises(ValueError, match="pieces"):
        Muon([p, q], pieces=[4, 1])  # 6 rows do not cut into 4 pieces


def test_muon_state_round_trips_bitwise_through_a_weights_only_checkpoint():
    """Save after 3 steps, load into a fresh model and optimizers, run 3 more: bit for bit the run that
    was never interrupted."""
    gen = torch.Generator().manual_seed(4)
    batches = [(x[:, :-1], x[:, 1:]) for x in (torch.randint(0, 29, (4, 17), generator=gen) for _ in range(6))]
    kw = dict(lr=3e-3, weight_decay=0.1, betas=(0.9, 0.99), device_type="cpu", kind="muon")
    model = _modern_model()
    opts = make_optimizers(model, **kw)
    _steps(model, opts, batches[:3])
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opts": [o.state_dict() for o in opts]}, buf)
    uninterrupted = _steps(model, opts, batches[3:])

    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed = _modern_model(seed=99)  # other initial weights: everything must come from the checkpoint
    resumed.load_state_dict(saved["model"])
    opts2 = make_optimizers(resumed, **kw)
    for opt, sd in zip(opts2, saved["opts"]):
        opt.load_state_dict(sd)
    assert _steps(resumed, opts2, batches[3:]) == uninterrupted
    for (n, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), n


def test_newton_schulz_runs_in_bf16_only_where_the_device_has_it_natively(monkeypatch):
    model = _modern_model()
    kw = dict(lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), device_type="cpu", kind="muon")
    monkeypatch.setattr(runtime.precision, "cpu_native_bf16", lambda: False)  # AVX2 only
    assert make_optimizers(model, **kw)[0].ns_dtype == torch.float32
    monkeypatch.setattr(runtime.precision, "cpu_native_bf16", lambda: True)  # AMX / AVX512-BF16
    assert make_optimizers(model, **kw)[0].ns_dtype == torch.bfloat16
    assert make_optimizers(model, **kw, ns_dtype=torch.float32)[0].ns_dtype == torch.float32  # given: kept
    with pytest.raises(ValueError, match="2-D weights only"):
        Muon([torch.nn.Parameter(torch.zeros(3))])
