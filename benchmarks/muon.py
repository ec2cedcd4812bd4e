"""What Muon costs: one training step of shakespeare_char_modern's model and batch (read from its YAML, so
the row follows the config) with Muon for the blocks' matrices, against the same step with AdamW for
every parameter; both the step train.py runs (training.step.train_step, training.optim.make_optimizers),
interleaved in one process, from the same weights on the same batches, in the dtype train.py's auto
picks. The targets (issue 20): a Muon step <= 1.5x an AdamW step where bf16 is emulated (AVX2 only,
where Newton-Schulz runs in fp32), <= 1.3x where it is native.

The floor, at 8 x 128 tokens: 5 Newton-Schulz iterations on the 16 hidden matrices are ~2.4 GFLOP,
forward and backward ~4.8 GFLOP, so in fp32 Muon cannot cost much less than ~1.5x AdamW at this batch.
"""
from __future__ import annotations

import torch

from model import GPT
from runtime.precision import autocast, cpu_native_bf16, dtype_name, make_scaler, training_dtype
from training.config import load_config
from training.optim import make_optimizers
from training.step import forward_backward_probe, train_step

from .timing import Variant, median, run_interleaved

CONFIG = "shakespeare_char_modern"
CHAR_VOCAB = 65  # tiny shakespeare's characters


def muon_vs_adamw(device: torch.device, *, warmup: int, iters: int, rounds: int, say, quick: bool = False) -> tuple[list[dict], dict]:
    cfg = load_config(["--config", CONFIG])
    if quick:  # smoke: the mechanics, not the figures
        cfg.model.n_layer, cfg.train.batch_size = 1, 2
    t, block = cfg.train, cfg.model.block_size
    torch.manual_seed(t.seed)
    weights = GPT(cfg.model.gpt_config(CHAR_VOCAB)).state_dict()
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):
        x = torch.randint(0, CHAR_VOCAB, (t.batch_size, block + 1), generator=gen)
        batches.append((x[:, :-1].to(device), x[:, 1:].to(device)))

    def build(kind: str):
        model = GPT(cfg.model.gpt_config(CHAR_VOCAB))
        model.load_state_dict(weights)
        model.to(device).train()
        opts = make_optimizers(model, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2),
                               device_type=device.type, kind=kind, muon_lr=t.muon_lr, muon_momentum=t.muon_momentum,
                               muon_ns_steps=t.muon_ns_steps, muon_split_qkv=t.muon_split_qkv)
        return model, opts

    probe_model, _ = build("adamw")
    dtype, note = training_dtype("auto", device, forward_backward_probe(
        probe_model, batches[0], lambda dt: autocast(device, dt)), run_steps=t.max_iters)
    scaler = make_scaler(device, dtype)

    def stepper(kind: str):
        model, opts = build(kind)
        return lambda i: train_step(model, opts, scaler, [batches[i % len(batches)]],
                                    amp=lambda: autocast(device, dtype), grad_clip=t.grad_clip).loss

    adamw, muon = Variant("adamw", stepper("adamw")), Variant("muon", stepper("muon"))
    ns_dtype = make_optimizers(probe_model, lr=t.lr, weight_decay=0.0, betas=(0.9, 0.99), device_type=device.type,
                               kind="muon")[0].ns_dtype
    say(f"[muon] {CONFIG}: batch {t.batch_size} x {block}, {dtype_name(dtype)}, Newton-Schulz in "
        f"{dtype_name(ns_dtype)}; {warmup} warm-up + {iters} timed steps each, {rounds} rounds")
    run_interleaved([adamw, muon], max(warmup, 1), iters, rounds, device)
    a, m = median(adamw.times), median(muon.times)
    tokens = t.batch_size * block
    native = device.type == "cuda" or cpu_native_bf16()
    row = {"section": "Muon vs AdamW", "name": f"ours muon step (base: ours adamw step, {CONFIG})",
           "precision": dtype_name(dtype), "compiled": False, "batch": t.batch_size, "unit": "ms/iter",
           "ours": m * 1e3, "base": a * 1e3, "ours_tok_s": tokens / m, "base_tok_s": tokens / a, "speedup": a / m,
           "ours_times_ms": [x * 1e3 for x in muon.times], "base_times_ms": [x * 1e3 for x in adamw.times]}
    info = {"config": CONFIG, "dtype": dtype_name(dtype), "ns_dtype": dtype_name(ns_dtype), "auto_note": note,
            "muon_ms": m * 1e3, "adamw_ms": a * 1e3, "ratio": m / a, "target": 1.3 if native else 1.5,
            "native_bf16": native}
    return [row], info
