"""What the project chooses per device, proven on the CPU: the LM head's loss path, the dtype on GPUs
with and without native bf16, the MFU peak, and that training and sampling need neither wandb nor
datasets when they are not used."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig
from runtime.loss_path import (CHUNK_BYTES, EXP_BLOCK_BYTES, LMLoss, choose_exp_block_rows, choose_loss_chunk_rows,
                               choose_weight_grad_product, loss_path, onednn_mm)
from runtime.precision import inference_dtype, make_scaler, training_dtype
from training.report.mfu import gpu_peak_flops, mfu, peak_flops

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.device("cuda", 0)  # a device object only: nothing runs on it


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend this machine has a GPU of a given compute capability, name and free memory."""
    def install(capability=(9, 0), name="NVIDIA H100 80GB HBM3", free_gb=70.0):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what T4/V100 say too
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free_gb * 2**30), 80 * 2**30))
    return install


# ------------------------------------------------------------------------------------------ loss path

def test_loss_path_is_full_logits_in_a_compiled_gpu_graph_and_bounded_chunks_otherwise(fake_gpu):
    # a CPU: a chunk's fp32 logits within CHUNK_BYTES (150 MiB), a multiple of 64 rows, at least 64
    assert choose_loss_chunk_rows(torch.device("cpu"), compiled=False, vocab_size=50257) == 768 == CHUNK_BYTES // 4 // 50257 // 64 * 64
    assert choose_loss_chunk_rows(torch.device("cpu"), compiled=True, vocab_size=50257) == 768
    assert choose_loss_chunk_rows(torch.device("cpu"), compiled=False, vocab_size=2**20) == 64  # the floor
    assert choose_loss_chunk_rows(torch.device("cpu"), compiled=False, vocab_size=65) is None  # a char model
    fake_gpu(free_gb=70.0)
    assert choose_loss_chunk_rows(CUDA, compiled=True, vocab_size=50304) is None
    # eager on a GPU: a chunk's fp32 logits take at most 1/16 of free memory, at most 8192 rows
    assert choose_loss_chunk_rows(CUDA, compiled=False, vocab_size=50304) == 8192
    fake_gpu(free_gb=16.0)
    rows = choose_loss_chunk_rows(CUDA, compiled=False, vocab_size=50304)
    # 16 GiB free: 1 GiB for the chunk is 5336 rows of 50304 fp32 logits, rounded down to a multiple of 256
    assert rows == 5120 and rows * 50304 * 4 <= 16 * 2**30 / 16
    fake_gpu(free_gb=0.01)
    assert choose_loss_chunk_rows(CUDA, compiled=False, vocab_size=50304) == 256  # the floor


def test_a_cpu_chunk_is_exponentiated_in_cache_sized_blocks_and_a_gpu_chunk_whole(fake_gpu):
    fake_gpu()
    assert choose_exp_block_rows(CUDA, 8192) is None  # every block would be two kernel launches
    assert choose_exp_block_rows(torch.device("cpu"), None) is None  # full logits: no chunks at all
    rows = choose_exp_block_rows(torch.device("cpu"), 768)
    assert rows == 1365 and rows * 768 * 4 <= EXP_BLOCK_BYTES < (rows + 1) * 768 * 4
    assert choose_exp_block_rows(torch.device("cpu"), 2**20) == 8  # the floor


def test_onednn_mm_equals_a_float64_product_and_hands_other_dtypes_to_torch_mm():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.rand(1000, 96, generator=gen), torch.randn(96, 40, generator=gen)
    ref = a.double() @ b.double()
    torch.testing.assert_close(onednn_mm(a, b).double(), ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(onednn_mm(a.double(), b.double()), a.double() @ b.double())  # fp64: torch.mm itself


def test_onednn_mm_falls_back_to_torch_mm_where_onednn_refuses(monkeypatch):
    def refuse(*args):
        raise RuntimeError("could not create a primitive descriptor")
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", refuse)
    a, b = torch.rand(50, 16), torch.randn(16, 8)
    assert torch.equal(onednn_mm(a, b), torch.mm(a, b))


def test_the_weight_gradient_product_is_timed_once_per_machine_and_shape_then_kept(monkeypatch, fake_gpu):
    import runtime.loss_path as loss_path

    verdicts = iter(["oneDNN", "torch.mm", "torch.mm"])
    calls = []

    def fake_fastest(candidates, run, device, **kw):  # a machine whose timing flips between runs
        calls.append(tuple(candidates))
        for name in candidates:
            run(name)  # both really run, on operands of the asked shape
        pick = next(verdicts)
        return pick, {name: (0.05 if name == pick else 0.08) for name in candidates}
    monkeypatch.setattr(loss_path, "fastest", fake_fastest)
    cpu = torch.device("cpu")
    first, note1 = choose_weight_grad_product(cpu, vocab_size=300, rows=64, n_embd=16)
    second, note2 = choose_weight_grad_product(cpu, vocab_size=300, rows=64, n_embd=16)
    assert first == second == "oneDNN" and calls == [("torch.mm", "oneDNN")]  # timed once, then reused
    assert "(1 chunk of 300 x 64 x 16 a step) by oneDNN: 80.0 ms by torch.mm, 50.0 ms by oneDNN (measured now" in note1
    assert "from the cache" in note2
    other, _ = choose_weight_grad_product(cpu, vocab_size=300, rows=32, n_embd=16)  # another shape: timed again
    assert other == "torch.mm" and len(calls) == 2
    fake_gpu()
    assert choose_weight_grad_product(CUDA, vocab_size=300, rows=64, n_embd=16) == ("torch.mm", "")  # CPUs only
    assert choose_weight_grad_product(cpu, vocab_size=300, rows=None, n_embd=16) == ("torch.mm", "")  # full logits
    monkeypatch.setattr(loss_path, "onednn_mm", lambda a, b: torch.mm(a, b) + 1e-3)  # a wrong product
    wrong, note = choose_weight_grad_product(cpu, vocab_size=300, rows=128, n_embd=16)
    assert wrong == "torch.mm" and "disagreed" in note and len(calls) == 2  # never chosen, nor timed


def test_the_product_is_timed_as_a_step_runs_it_a_first_chunk_then_the_others_added_in_place(monkeypatch):
    import model.fused_ce as fused_ce
    import runtime.loss_path as loss_path

    seen = []
    seconds = iter([{"torch.mm": 0.080, "oneDNN": 0.050}, {"torch.mm": 0.080, "oneDNN": 0.050},
                    {"torch.mm": 0.060, "oneDNN": 0.075}])
    real_add = fused_ce.add_weight_grad
    monkeypatch.setattr(fused_ce, "add_weight_grad",
                        lambda g, a, b, p=None: seen.append((g is None, p)) or real_add(g, a, b, p))

    def fake_fastest(candidates, run, device, **kw):
        for c in candidates:
            run(c)
        return "ignored", next(seconds)
    monkeypatch.setattr(loss_path, "fastest", fake_fastest)
    cpu = torch.device("cpu")
    # one chunk a step: only the first product counts, where oneDNN is faster (50 against 80 ms)
    assert loss_path.choose_weight_grad_product(cpu, vocab_size=200, rows=8, n_embd=4)[0] == "oneDNN"
    assert seen == [(True, None), (True, loss_path.onednn_mm)]
    # three chunks: 80 + 2 x 60 = 200 ms by torch.mm against 50 + 2 x 75 = 200 by oneDNN: not 5% faster, so torch.mm
    seen.clear()
    name, note = loss_path.choose_weight_grad_product(cpu, vocab_size=200, rows=8, n_embd=4, chunks=3)
    assert name == "torch.mm" and "(3 chunks of 200 x 8 x 4 a step)" in note and "200.0 ms by oneDNN" in note
    assert seen == [(True, None), (True, loss_path.onednn_mm), (False, None), (False, loss_path.onednn_mm)]


def test_the_loss_path_gives_the_devices_chunks_and_blocks():
    loss = loss_path(torch.device("cpu"), compiled=False, vocab_size=9000)
    assert loss.chunk_rows == choose_loss_chunk_rows(torch.device("cpu"), compiled=False, vocab_size=9000)
    assert loss.exp_block_rows == choose_exp_block_rows(torch.device("cpu"), loss.chunk_rows)
    assert loss.product == "torch.mm"  # a measured choice a run makes once: settle_loss_product
    assert loss_path(torch.device("cpu"), compiled=False, vocab_size=9000, product="oneDNN").product == "oneDNN"
    char = loss_path(torch.device("cpu"), compiled=False, vocab_size=65)
    assert char.chunk_rows is None and char.exp_block_rows is None  # full logits
    assert loss_path(torch.device("cpu"), compiled=False, vocab_size=9000, rows=None) == LMLoss()  # the plan's None


def test_a_resumed_run_keeps_its_saved_product_unless_this_machine_lacks_it(monkeypatch):
    import training.builders
    from checkpoint.format import upgrade
    from checkpoint import Resume
    from training.builders import settle_loss_product
    from training.parallel.distributed import Parallel
    from training.plan import RunPlan

    monkeypatch.setattr(training.builders, "choose_weight_grad_product", lambda *a, **k: pytest.fail("not on resume"))
    cpu = torch.device("cpu")
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=9000))
    loss = loss_path(cpu, compiled=False, vocab_size=9000)

    def resumed(train: dict, m=model) -> tuple[str, str]:  # a checkpoint of format 2, upgraded as it is read
        plan = RunPlan.start(Resume(Path("ckpt.pt"), upgrade({"version": 2, "train": train})))
        name = settle_loss_product(plan, Parallel(), cpu, m, loss, 64)
        return name, plan.decisions["loss_product"].line()

    saved = lambda name: {"loss_product": name}  # noqa: E731
    assert resumed(saved("oneDNN")) == ("oneDNN", "LM head's weight gradient by oneDNN (decided when this run started)")
    assert resumed({})[0] == "torch.mm"  # older runs
    monkeypatch.setattr(training.builders, "weight_grad_product_available", lambda device: False)  # resumed elsewhere
    name, note = resumed(saved("oneDNN"))
    assert name == "torch.mm" and "chose 'oneDNN' when it started, which this machine does not have" in note
    assert resumed(saved("something new"))[0] == "torch.mm"
    char = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=65))
    fresh = RunPlan()
    assert settle_loss_product(fresh, Parallel(), cpu, char, loss_path(cpu, compiled=False, vocab_size=65), 64) == \
        "torch.mm" and fresh.decisions["loss_product"].note == ""



def test_a_loss_given_blocks_and_a_product_trains_with_torch_cross_entropys_gradients(monkeypatch):
    from runtime import loss_path as lp

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=300))
    ref = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=300)).double()
    ref.load_state_dict(model.state_dict())
    x, y = torch.randint(0, 300, (3, 12)), torch.randint(0, 300, (3, 12))
    y[0, :4] = -1
    calls = []
    monkeypatch.setitem(lp.WEIGHT_GRAD_PRODUCTS, "recorded", lambda a, b: calls.append(tuple(a.shape)) or onednn_mm(a, b))
    loss = LMLoss(chunk_rows=16, exp_block_rows=40, product="recorded")(model, x, y)  # 36 rows: 3 chunks, the last partial
    loss.backward()
    expected = F.cross_entropy(ref(x).view(-1, 300), y.view(-1), ignore_index=-1)  # the textbook loss, in fp64
    expected.backward()
    assert calls == [(300, 16), (300, 16), (300, 4)]  # the loss handed its product to every chunk
    assert abs(loss.item() - expected.item()) < 1e-5
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("chunk_rows", [None, 7, 384])
def test_every_loss_path_gives_torch_cross_entropy_and_its_gradients(chunk_rows):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=37)).double()
    x = torch.randint(0, 37, (3, 12))
    y = torch.randint(0, 37, (3, 12))
    y[0, :4] = -1  # ignored positions
    loss = LMLoss(chunk_rows=chunk_rows)(model, x, y)
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref = F.cross_entropy(model(x).view(-1, 37), y.view(-1), ignore_index=-1)  # the textbook loss
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-9, atol=1e-12, msg=n)


# ------------------------------------------------------------------------------------------ dtypes

@pytest.mark.parametrize("capability,name", [((7, 5), "Tesla T4"), ((7, 0), "Tesla V100-SXM2-16GB")])
def test_a_gpu_without_native_bf16_trains_and_samples_in_fp16_with_a_grad_scaler(fake_gpu, capability, name):
    """torch.cuda.is_bf16_supported() says True on these (emulated, slow): auto must not believe it."""
    fake_gpu(capability=capability, name=name)
    dtype, note = training_dtype("auto", CUDA)
    assert dtype == torch.float16 and "GradScaler" in note and f"{capability[0]}.{capability[1]}" in note
    assert make_scaler(torch.device("cpu"), dtype).is_enabled()  # fp16 always comes with a scaler
    assert inference_dtype("auto", CUDA)[0] == torch.float16


def test_ampere_and_newer_train_and_sample_in_bf16_without_a_scaler(fake_gpu):
    for capability in ((8, 0), (8, 9), (9, 0)):
        fake_gpu(capability=capability)
        assert training_dtype("auto", CUDA)[0] == torch.bfloat16
        assert inference_dtype("auto", CUDA)[0] == torch.bfloat16
    assert not make_scaler(torch.device("cpu"), torch.bfloat16).is_enabled()
    fake_gpu(capability=(7, 5))
    assert training_dtype("bfloat16", CUDA)[0] == torch.bfloat16  # an explicit choice is kept


# ------------------------------------------------------------------------------------------ MFU

def test_fp32_mfu_uses_the_tf32_peak_when_tf32_matmuls_are_on(fake_gpu):
    fake_gpu(name="NVIDIA H100 80GB HBM3")
    # Set and restored by hand: on a CUDA build allow_tf32 is a property that monkeypatch can't undo.
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        peak, note = peak_flops(CUDA, torch.float32)
        assert peak == 495e12 and "tf32" in note  # H100 SXM dense TF32, not the 67 TFLOP/s of plain fp32
        torch.backends.cuda.matmul.allow_tf32 = False
        assert peak_flops(CUDA, torch.float32)[0] == 67e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert peak_flops(CUDA, torch.bfloat16)[0] == 989e12
    assert gpu_peak_flops("Tesla V100-SXM2-16GB", torch.float32, tf32=True) == 15.7e12  # no TF32 on Volta


def test_mfu_above_one_is_reported_as_unknown_not_shown():
    """On a CPU the fp16 probe once measured 1 GFLOP/s, and MFU read 193%."""
    assert mfu(1e9, 1.93, 1e9) is None
    assert mfu(1e9, 0.5, 1e9) == pytest.approx(0.5)
    assert mfu(1e9, 1.0, 1e9) == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------ optional packages

@pytest.mark.slow
def test_training_and_sampling_run_without_wandb_or_datasets_installed(tmp_path):
    """A GPU machine may lack both: with wandb disabled and the built-in dataset, neither is imported."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nfor name in ('wandb', 'datasets'):\n    sys.modules[name] = None  # import fails\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    out = tmp_path / "out"
    common = ["--data.tokenizer=char", f"--data.root={tmp_path / 'prepared'}", f"--train.out_dir={out}",
              "--model.n_layer=1", "--model.n_head=2", "--model.n_embd=32", "--model.block_size=32",
              "--train.max_iters=3", "--train.eval_interval=3", "--train.eval_iters=1", "--train.device=cpu",
              "--train.dtype=float32", "--wandb.mode=disabled"]
    check = subprocess.run([sys.executable, "-c", "import wandb"], env=env, capture_output=True, text=True)
    assert "ImportError" in check.stderr or "ModuleNotFoundError" in check.stderr  # the blocker works
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), *common], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, str(ROOT / "sample.py"), "--checkpoint", str(out), "--max-new-tokens", "5",
                        "--seed", "1"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-2000:]


# ------------------------------------------------------------------------------------------ dtype auto by timing

def test_auto_picks_the_faster_of_two_fake_steps(monkeypatch):
    import runtime.precision
    from runtime.precision import fastest

    monkeypatch.setattr(runtime.precision, "cpu_native_bf16", lambda: True)  # a CPU with AMX / AVX512-BF16

    def fake(slow):
        def run(dtype):
            time.sleep(0.02 if dtype == slow else 0.002)
        return run

    cpu = torch.device("cpu")
    assert fastest((torch.float32, torch.bfloat16), fake(torch.float32), cpu)[0] == torch.bfloat16
    pick, seconds = fastest((torch.float32, torch.bfloat16), fake(torch.bfloat16), cpu)
    assert pick == torch.float32 and seconds["bfloat16"] > seconds["float32"] >= 0.002
    dtype, note = training_dtype("auto", cpu, forward_backward=fake(torch.float32))
    assert dtype == torch.bfloat16 and note.startswith("dtype auto -> bfloat16: the model's forward + backward took ")


def test_auto_keeps_float32_when_bfloat16_is_only_a_little_faster(monkeypatch):
    """A 2% lead is within the probe's noise: the more exact dtype stays. A 10% lead wins. (A fake clock
    that each fake step advances by its duration, so the test doesn't depend on sleep's precision.)"""
    import types

    import runtime.precision

    clock = [0.0]
    monkeypatch.setattr(runtime.precision, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def steps(bf16_seconds):
        def run(dtype):
            clock[0] += bf16_seconds if dtype == torch.bfloat16 else 0.020
        return run

    cpu = torch.device("cpu")
    pick, seconds = runtime.precision.fastest((torch.float32, torch.bfloat16), steps(0.0196), cpu)
    assert seconds == pytest.approx({"float32": 0.020, "bfloat16": 0.0196}) and pick == torch.float32
    assert runtime.precision.fastest((torch.float32, torch.bfloat16), steps(0.018), cpu)[0] == torch.bfloat16


def test_the_probe_leaves_weights_gradients_and_rng_as_they_were():
    from runtime.precision import autocast
    from training.step import forward_backward_probe

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, dropout=0.5)).train()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    batch = (torch.randint(0, 11, (2, 8)), torch.randint(0, 11, (2, 8)))
    rng = torch.get_rng_state()
    probe = forward_backward_probe(model, LMLoss(), batch, lambda dt: autocast(torch.device("cpu"), dt))
    for dt in (torch.float32, torch.bfloat16, torch.float32):
        probe(dt)
    assert torch.equal(torch.get_rng_state(), rng)  # dropout drew from a forked stream
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


@pytest.fixture
def fake_clock(monkeypatch):
    """runtime.precision's clock, advanced only by the fake steps: timings exactly as the test says."""
    import types

    import runtime.precision

    clock = [0.0]
    monkeypatch.setattr(runtime.precision, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    return clock


def test_the_training_probe_never_runs_bf16_where_the_cpu_has_no_native_bf16(monkeypatch):
    """On an AVX2-only CPU bf16 is emulated (~25x slower): auto must not even try it, in training or
    in sampling, and must say why it kept fp32."""
    import runtime.precision

    ran = []
    monkeypatch.setattr(runtime.precision, "cpu_native_bf16", lambda: False)
    cpu = torch.device("cpu")
    dtype, note = training_dtype("auto", cpu, forward_backward=ran.append, run_steps=1000)
    assert dtype == torch.float32 and "no native bf16" in note
    dtype, note = inference_dtype("auto", cpu, decode=ran.append)
    assert dtype == torch.float32 and "no native bf16" in note
    assert torch.bfloat16 not in ran
    assert runtime.precision.fastest_native_dtype(cpu) == torch.float32
    monkeypatch.setattr(runtime.precision, "cpu_native_bf16", lambda: True)  # AMX / AVX512-BF16: it is timed
    training_dtype("auto", cpu, forward_backward=ran.append, run_steps=1000)
    assert torch.bfloat16 in ran and runtime.precision.fastest_native_dtype(cpu) == torch.bfloat16


@pytest.mark.parametrize("machine, onednn, avx512_bf16, amx, native", [
    ("x86_64", True, False, False, False),   # AVX512 without the bf16 instructions: oneDNN emulates
    ("x86_64", True, True, False, True),     # Zen 4 / Zen 5: AVX512-BF16
    ("x86_64", True, False, True, True),     # AMX
    ("x86_64", False, True, True, False),    # capped by ONEDNN_MAX_CPU_ISA=AVX2
    ("aarch64", True, False, False, True),   # oneDNN's answer is trusted off x86
    ("aarch64", False, False, False, False),
])
def test_native_bf16_on_a_cpu_needs_the_bf16_instructions_not_only_onednn(monkeypatch, machine, onednn,
                                                                           avx512_bf16, amx, native):
    """oneDNN says it supports bf16 on every AVX512 CPU, where it converts in software and a bf16 matmul
    runs at under half fp32's speed: such a CPU is not native, and Muon, auto and the bench keep fp32."""
    import platform

    import runtime.precision

    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(runtime.precision, "_onednn_bf16", lambda: onednn)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert runtime.precision.cpu_native_bf16() is native
    ran = []
    training_dtype("auto", torch.device("cpu"), forward_backward=ran.append, run_steps=1000)
    assert (torch.bfloat16 in ran) is native
    assert runtime.precision.fastest_native_dtype(torch.device("cpu")) == (torch.bfloat16 if native else torch.float32)


def _cpuinfo_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def test_native_bf16_agrees_with_the_kernels_cpu_flags_on_this_machine():
    """The reference is the kernel's own list of this CPU's flags, read independently of torch: native
    bf16 exactly when oneDNN is not capped and the CPU has avx512_bf16 or amx_bf16."""
    import platform

    import runtime.precision

    flags = _cpuinfo_flags()
    if flags is None or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("needs Linux's /proc/cpuinfo on x86")
    has_instructions = bool(flags & {"avx512_bf16", "amx_bf16"})
    assert runtime.precision.cpu_native_bf16() == (has_instructions and runtime.precision._onednn_bf16())


def test_a_candidate_whose_first_timed_call_is_over_twice_the_others_is_abandoned(fake_clock):
    import runtime.precision

    calls = []

    def run(dtype):  # bf16 2.5x slower: after its warm-up and one timed call it is never run again, and
        calls.append(dtype)  # with nothing left to compare, neither is fp32
        fake_clock[0] += 0.050 if dtype == torch.bfloat16 else 0.020

    pick, seconds = runtime.precision.fastest((torch.float32, torch.bfloat16), run, torch.device("cpu"), reps=3)
    assert pick == torch.float32 and calls.count(torch.bfloat16) == 2 and calls.count(torch.float32) == 2
    assert seconds == pytest.approx({"float32": 0.020, "bfloat16": 0.050})
    calls.clear()  # 1.9x slower: within the rule, so both are timed to the end, and fp32 wins on the medians
    fake_clock[0] = 0.0
    pick, _ = runtime.precision.fastest((torch.float32, torch.bfloat16),
                                        lambda dt: (calls.append(dt), fake_clock.__setitem__(0, fake_clock[0] + (
                                            0.038 if dt == torch.bfloat16 else 0.020))), torch.device("cpu"), reps=3)
    assert pick == torch.float32 and calls.count(torch.bfloat16) == 4


def test_the_dtype_decision_costs_at_most_5_s_or_2_percent_of_the_run(fake_clock):
    """Steps of 1 s each: a 100-step run may spend 5 s deciding (warm-up and one timed round, 4 s, then
    no room for another round); a 10,000-step run 2% of 10,000 s = 200 s, so all 3 rounds run."""
    import runtime.precision

    def run(dtype):
        fake_clock[0] += 1.0

    cpu = torch.device("cpu")
    for steps, spent in ((100, 4.0), (10_000, 8.0)):
        fake_clock[0] = 0.0
        runtime.precision.fastest((torch.float32, torch.bfloat16), run, cpu, reps=3,
                                  budget_s=lambda first: runtime.precision.decision_budget_s(first * steps))
        assert fake_clock[0] == spent
    assert runtime.precision.decision_budget_s(0) == 5.0 and runtime.precision.decision_budget_s(1000) == 20.0
