"""What Muon costs: one training step of shakespeare_char_modern's model and batch (read from its YAML, so
the row follows the config) with Muon for the blocks' matrices, against the same step with AdamW for
every parameter; both the step train.py runs, built by the run's chain (training.builders.build_trainer),
interleaved in one process, from the same weights on the same batches, in the dtype train.py's auto
picks. The targets (issue 20): a Muon step <= 1.5x an AdamW step where bf16 is emulated (AVX2 only,
where Newton-Schulz runs in fp32), <= 1.3x where it is native.

The floor, at 8 x 128 tokens: 5 Newton-Schulz iterations on the 16 hidden matrices are ~2.4 GFLOP,
forward and backward ~4.8 GFLOP, so in fp32 Muon cannot cost much less than ~1.5x AdamW at this batch.
"""
from __future__ import annotations

import torch

from model import GPT
from runtime.precision import cpu_native_bf16
from training.builders import build_trainer
from training.config.sections import load_config
from training.parallel.distributed import Parallel
from training.plan import RunPlan

from .timing import Variant, median, run_interleaved

CONFIG = "shakespeare_char_modern"
CHAR_VOCAB = 65  # tiny shakespeare's characters


def muon_vs_adamw(device: torch.device, *, warmup: int, iters: int, rounds: int, say, quick: bool = False) -> tuple[list[dict], dict]:
    # quick: a smoke test, the mechanics, not the figures
    cfg = load_config(["--config", CONFIG] + (["--model.n_layer=1", "--train.batch_size=2"] if quick else []))
    t, block = cfg.train, cfg.model.block_size
    torch.manual_seed(t.seed)
    weights = GPT(cfg.model.gpt_config(CHAR_VOCAB)).state_dict()
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):
        x = torch.randint(0, CHAR_VOCAB, (t.batch_size, block + 1), generator=gen)
        batches.append((x[:, :-1].to(device), x[:, 1:].to(device)))

    class Batches:  # the chain's loaders: these batches, no eval batches
        def get_batch(self, i: int, micro: int = 0):
            return batches[i % len(batches)]

    def build(kind: str, dtype: str):
        """The run's chain for this config with `kind`'s optimizer, from the same weights."""
        run_cfg = load_config(["--config", CONFIG, f"--train.optimizer={kind}", f"--train.dtype={dtype}",
                               "--train.device=" + device.type] + (["--model.n_layer=1", "--train.batch_size=2"]
                                                                   if quick else []))
        model = GPT(run_cfg.model.gpt_config(CHAR_VOCAB))
        model.load_state_dict(weights)
        plan = RunPlan()
        trainer = build_trainer(run_cfg, Parallel(), device, model.to(device).train(), plan,
                                lambda micro: (Batches(), {}), say=lambda line: None)
        return trainer, plan

    _, plan = build("adamw", "auto")  # the dtype train.py's auto picks here
    dtype, note = plan.dtype, plan.decisions["dtype"].note

    def stepper(kind: str):
        trainer = build(kind, dtype)[0]
        return lambda i: trainer.step([batches[i % len(batches)]]).loss

    adamw, muon = Variant("adamw", stepper("adamw")), Variant("muon", stepper("muon"))
    ns_dtype = build("muon", dtype)[0].step.optimizers[0].ns_dtype
    say(f"[muon] {CONFIG}: batch {t.batch_size} x {block}, {dtype}, Newton-Schulz in "
        f"{str(ns_dtype).removeprefix('torch.')}; {warmup} warm-up + {iters} timed steps each, {rounds} rounds")
    run_interleaved([adamw, muon], max(warmup, 1), iters, rounds, device)
    a, m = median(adamw.times), median(muon.times)
    tokens = t.batch_size * block
    native = device.type == "cuda" or cpu_native_bf16()
    row = {"section": "Muon vs AdamW", "name": f"ours muon step (base: ours adamw step, {CONFIG})",
           "precision": dtype, "compiled": False, "batch": t.batch_size, "unit": "ms/iter",
           "ours": m * 1e3, "base": a * 1e3, "ours_tok_s": tokens / m, "base_tok_s": tokens / a, "speedup": a / m,
           "ours_times_ms": [x * 1e3 for x in muon.times], "base_times_ms": [x * 1e3 for x in adamw.times]}
    info = {"config": CONFIG, "dtype": dtype, "ns_dtype": str(ns_dtype).removeprefix('torch.'), "auto_note": note,
            "muon_ms": m * 1e3, "adamw_ms": a * 1e3, "ratio": m / a, "target": 1.3 if native else 1.5,
            "native_bf16": native}
    return [row], info
