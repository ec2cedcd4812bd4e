"""The training helpers one by one, against hand-computed values: schedule, optimizer groups, MFU
table, RNG state round trip through a checkpoint, the stop flag."""
from __future__ import annotations

import os
import random
import signal

import numpy as np
import pytest
import torch

from model import GPT, GPTConfig
from checkpoint import load_checkpoint, save_checkpoint
from training.report.mfu import gpu_peak_flops, mfu, peak_flops
from training.optim import make_optimizer
from training.state import get_rng_state, set_rng_state
from training.timing.schedule import lr_at
from training.parallel.signals import StopFlag

SCHED = dict(lr=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=110)


@pytest.mark.parametrize("step,expected", [
    (0, 1e-4),  # warmup: 1e-3 * 1/10
    (4, 5e-4),  # 1e-3 * 5/10
    (9, 1e-3),  # last warmup step reaches the peak
    (10, 1e-3),  # cosine starts at the peak
    (35, 8.6819805e-4),  # progress 1/4: 1e-4 + 9e-4 * (1 + cos(pi/4)) / 2
    (60, 5.5e-4),  # progress 1/2: halfway between peak and floor
    (109, 1.00222048e-4),  # last step that runs: progress 99/100
    (110, 1e-4),  # the end: min_lr
    (500, 1e-4),  # past the end: stays at min_lr
])
def test_schedule_matches_hand_computed_values(step, expected):
    assert lr_at(step, **SCHED) == pytest.approx(expected, rel=1e-7)


def test_schedule_without_warmup_starts_at_peak():
    assert lr_at(0, lr=6e-4, min_lr=0.0, warmup_iters=0, max_iters=100) == 6e-4
    assert lr_at(50, lr=6e-4, min_lr=0.0, warmup_iters=0, max_iters=100) == pytest.approx(3e-4)


def test_weight_decay_on_matrices_and_embeddings_only():
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=2, n_head=2, n_embd=8))
    opt = make_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), device_type="cpu")
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = ({names[id(p)] for p in g["params"]} for g in opt.param_groups)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    per_block_matrices = ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"]
    assert decay == {"transformer.wte.weight", "transformer.wpe.weight"} | {
        f"transformer.h.{i}.{m}" for i in range(2) for m in per_block_matrices}
    per_block_vectors = ["ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "attn.c_attn.bias",
                         "attn.c_proj.bias", "mlp.c_fc.bias", "mlp.c_proj.bias"]
    assert no_decay == {"transformer.ln_f.weight", "transformer.ln_f.bias"} | {
        f"transformer.h.{i}.{v}" for i in range(2) for v in per_block_vectors}
    assert opt.defaults["fused"]  # the fused kernel on CPU as on CUDA
    assert not make_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), device_type="mps").defaults["fused"]


@pytest.mark.parametrize("name,dtype,expected", [
    ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312e12),
    ("NVIDIA A100-SXM4-80GB", torch.float32, 19.5e12),
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989e12),
    ("NVIDIA H100 PCIe", torch.bfloat16, 756e12),
    ("NVIDIA A10G", torch.bfloat16, 70e12),  # not A10, not A100
    ("NVIDIA L4", torch.bfloat16, 121e12),
    ("NVIDIA L40S", torch.bfloat16, 362e12),  # not L4
    ("Tesla V100-SXM2-16GB", torch.float16, 125e12),
    ("NVIDIA GeForce RTX 4090", torch.bfloat16, 165e12),
    ("Some Future GPU 9000", torch.bfloat16, None),  # unknown: no MFU rather than a made-up peak
])
def test_gpu_peak_table(name, dtype, expected):
    assert gpu_peak_flops(name, dtype) == expected


def test_mfu_arithmetic_and_cpu_peak_sources():
    # 1e6 tokens/s * 6e8 FLOPs/token = 6e14 FLOP/s over 2 GPUs of 1e15 -> 30 %
    assert mfu(6e8, 1e6, 1e15, world_size=2) == pytest.approx(0.3)
    assert mfu(6e8, 1e6, None) is None
    assert peak_flops(torch.device("cpu"), torch.float32, override=5e11)[0] == 5e11
    assert peak_flops(torch.device("cpu"), torch.bfloat16, measured={"bfloat16": 4e11})[0] == 4e11
    probed, note = peak_flops(torch.device("cpu"), torch.float32)
    assert 1e8 < probed < 1e14 and "matmul probe on cpu" in note


def test_rng_state_survives_a_weights_only_checkpoint(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    save_checkpoint(tmp_path / "ckpt.pt", {"rng": get_rng_state()})
    expected = (random.random(), np.random.rand(3).tolist(), torch.rand(3), random.gauss(0, 1))
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    set_rng_state(load_checkpoint(tmp_path / "ckpt.pt")["rng"])
    got = (random.random(), np.random.rand(3).tolist(), torch.rand(3), random.gauss(0, 1))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2]) and got[3] == expected[3]


def test_first_signal_sets_the_flag_second_interrupts():
    before = signal.getsignal(signal.SIGTERM)
    flag = StopFlag().install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.requested and flag.reason == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        flag.restore()
    assert signal.getsignal(signal.SIGTERM) == before


def test_metrics_are_strict_json_with_null_for_non_finite_values_and_a_resume_drops_the_redone_steps(tmp_path):
    import json

    from training.report.metrics import MetricsLog

    log = MetricsLog(tmp_path)
    for i, loss in enumerate([3.0, float("inf"), float("nan"), 2.5], start=1):
        log.append(i, {"train/loss": loss, "lr": 1e-3})
    strict = [json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
              for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/loss"] for r in strict] == [3.0, None, None, 2.5]
    kept = list(MetricsLog(tmp_path).resume_at(2))  # the records up to the checkpoint, for wandb's missing steps
    assert [r["iter"] for r in kept] == [1, 2] and kept[1]["train/loss"] is None
    assert [json.loads(line)["iter"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_damaged_metrics_line_is_dropped_with_a_note_and_the_run_stays_resumable(tmp_path, capsys, monkeypatch):
    """A non-UTF-8 byte, a line that is not JSON, a NaN or Infinity (which json.loads takes and this log never
    writes: before, a traceback and no resume), or a line over MAX_METRICS_LINE (here lowered to 80 bytes)
    anywhere in metrics.jsonl: resume drops that line, says so in one line, and keeps the rest."""
    import json

    from training.report import metrics

    monkeypatch.setattr(metrics, "MAX_METRICS_LINE", 80)
    (tmp_path / "metrics.jsonl").write_bytes(b'{"iter": 1, "train/loss": 3.0}\n{"iter": 2, "train/lo\xff\xfess": 2.9}\n'
                                             b'not json\n{"iter": 2, "train/loss": NaN}\n{"iter": 2, "lr": -Infinity}\n'
                                             b'{"iter": 2, "note": "' + b"x" * 100 + b'"}\n'
                                             b'{"iter": 3, "train/loss": 2.8}\n{"iter": 4, "train/loss": 2.7}\n')
    kept = list(metrics.MetricsLog(tmp_path).resume_at(3))
    assert [r["iter"] for r in kept] == [1, 3]
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "dropped 5 damaged line(s)" in out[0]
    assert [json.loads(line)["iter"] for line in (tmp_path / "metrics.jsonl").read_text("utf-8").splitlines()] == [1, 3]


def test_a_resume_keeps_every_step_once_in_order_and_says_what_it_dropped(tmp_path, capsys):
    """A metrics.jsonl edited by hand (found from outside: duplicated lines, a step out of order and a JSON line
    that is no record were all kept, so the file held steps 4, 4, 6, 6, 8): a record of a step at or before the
    one kept last is dropped, a line of JSON that is no record counts as damaged, and the note says both."""
    import json

    from training.report.metrics import MetricsLog

    steps = [4, 4, 6, 5, 6, 8, 12]
    lines = [json.dumps({"iter": i, "train/loss": 1.0}) for i in steps] + ["[1, 2]", '{"iter": true}', '"x"']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    kept = list(MetricsLog(tmp_path).resume_at(10))
    assert [r["iter"] for r in kept] == [4, 6, 8]  # 12 is past the checkpoint: redone, not counted
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "dropped 3 damaged line(s)" in out[0] and "3 record(s) of a step already logged" in out[0]


def test_a_resume_over_a_long_metrics_file_holds_a_line_at_a_time_never_the_file(tmp_path):
    """Before: resume_at read metrics.jsonl whole and kept its records as a list of dicts (for the steps wandb
    lacks and the samples table): the 1 GiB a run may log took several GB. Now the file is rewritten a line at a
    time and the kept records are read from it again when wanted: the peak is a few lines (2 KB each here),
    and wandb is still sent exactly the kept steps it lacks, in order."""
    import json
    import tracemalloc

    from training.report.metrics import MetricsLog
    from training.report.wandb_logger import WandbLogger

    pad = "x" * 2000
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"iter": i, "train/loss": i / 8, "note": pad}) + "\n" for i in range(1, 5001)))
    size = path.stat().st_size
    logger = WandbLogger.__new__(WandbLogger)  # its sending only: a run that checks each step it is sent
    logger.run, logger.logged_through, logger._print, logger._pending, logger._media = True, 1000, lambda line: None, [], None
    got = {"next": 1001, "rows": 0}

    def log(values, step):
        assert step == got["next"] and values == {"train/loss": step / 8, "note": pad}, step
        got["next"] += 1
    logger.log = log
    tracemalloc.start()
    try:
        kept = MetricsLog(tmp_path).resume_at(4000)
        logger._send_missing(kept)
        for i, record in enumerate(kept, 1):  # (the samples table's reading)
            assert record == {"iter": i, "train/loss": i / 8, "note": pad}
            got["rows"] += 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == {"next": 4001, "rows": 4000} and len(kept) == 4000 and peak < size / 50, (got, peak, size)
    assert path.read_text().splitlines() == [json.dumps({"iter": i, "train/loss": i / 8, "note": pad})
                                             for i in range(1, 4001)]
