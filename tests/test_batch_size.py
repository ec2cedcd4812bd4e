"""train.batch_size auto (training/batch_size.py): the largest divisor of the per-rank batch that fits an
injected limit, found by a binary search that never measures above a size known not to fit; an
out-of-memory error is "does not fit", never a crash; bad settings are one line; end to end on a CPU the
choice keeps the global batch, is saved, and a resume under another limit keeps it bit for bit."""
from __future__ import annotations

import pytest
import torch

from training import loop
import training.batch_size
from checkpoint import load_checkpoint
from errors import UserError
from faults import inject
from runtime.loss_path import LMLoss
from training.batch_size import check_world_size, choose, divisors, largest_fitting, measure_batch, reapply_batch
from training.plan import Batch, Decision
from training.config.sections import load_config
from training.parallel.distributed import Parallel

from tiny_runs import tiny_argv

GIB = 2**30


# ---------------------------------------------------------------------------------- the decision

def test_divisors_are_every_micro_batch_that_keeps_the_global_batch():
    assert divisors(48) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 48]
    assert divisors(1) == [1] and divisors(49) == [1, 7, 49] and divisors(512) == [2**k for k in range(10)]


def test_the_largest_fitting_divisor_is_chosen_with_few_measurements():
    # peak 100 + 10 m bytes against 90% of 300 = 270: m <= 17; of 48's divisors 1,2,3,4,6,8,12,16,24,48 that is 16
    calls = []

    def measure(m):
        calls.append(m)
        return 100 + 10 * m

    assert choose(48, measure, 300) == (16, 260)
    for i, m in enumerate(calls):  # never above a size already known not to fit
        assert all(m < earlier for earlier in calls[:i] if 100 + 10 * earlier > 270)
    assert len(calls) == len(set(calls)) <= 4  # ceil(log2(10 + 1)) for 10 candidates


@pytest.mark.parametrize("threshold", range(0, 13))
def test_the_binary_search_finds_the_boundary_wherever_it_lies(threshold):
    candidates = [1, 2, 3, 4, 6, 8, 12, 16, 24, 48, 96, 192]
    tried = []

    def fits(m):
        tried.append(m)
        return candidates.index(m) < threshold

    best = largest_fitting(candidates, fits)
    assert best == (candidates[threshold - 1] if threshold else None)
    assert len(tried) <= 4  # ceil(log2(12 + 1))


def test_out_of_memory_above_a_size_means_the_next_smaller_one_is_chosen():
    calls = []

    def measure(m):
        calls.append(m)
        if m > 6:
            raise torch.OutOfMemoryError(f"CUDA out of memory (tried {m})")
        return 1000

    assert choose(48, measure, 10**9) == (6, 1000)  # no exception escapes
    for i, m in enumerate(calls):
        assert all(m < earlier for earlier in calls[:i] if earlier > 6)


def test_nothing_fitting_at_one_sequence_is_one_line():
    with pytest.raises(UserError, match=r"^train.batch_size auto: even a micro-batch of 1 sequence needs 1.0 GiB, over "
                                        r"90% of the 1.0 GiB this device has; lower model.block_size") as e:
        choose(48, lambda m: GIB * m, GIB)
    assert "\n" not in str(e.value)

    def oom(m):
        raise torch.OutOfMemoryError("CUDA out of memory")
    with pytest.raises(UserError, match=r"even a micro-batch of 1 sequence runs out of memory") as e:
        choose(48, oom, GIB)
    assert "\n" not in str(e.value)


def _auto(*extra):
    return load_config(["--train.batch_size=auto", "--train.global_batch_size=16", "--train.device=cpu", *extra]).train


def test_a_resumed_auto_run_reapplies_its_choice_and_refuses_a_world_size_it_cannot_divide():
    note = "batch_size auto: 8 x 32 tokens per micro-step"
    # 16 sequences on 2 ranks: 8 each, 1 micro-step each, 2 global
    kept = Decision(Batch(8, None), note, kept=True)
    again = reapply_batch(_auto(), kept, Parallel(world_size=2))
    assert again.value == (8, 2) and again.kept and again.line().endswith("(decided when this run started)")
    with pytest.raises(UserError, match=r"^cannot resume on 4 ranks: this run's micro-batch \(8, chosen by batch_size "
                                        r"auto\) does not divide the 4 sequences per rank of train.global_batch_size=16; "
                                        r"run on 1, 2 rank\(s\)$"):
        reapply_batch(_auto(), kept, Parallel(world_size=4))


def test_a_fresh_auto_decision_keeps_the_global_batch_on_every_rank():
    # 16 sequences on one process, 4 fit: 4 per micro-step, 4 micro-steps
    d = measure_batch(_auto(), torch.nn.Linear(1, 1), torch.device("cpu"), Parallel(), dtype=torch.float32,
                      block_size=32, vocab_size=65, loss=LMLoss(), limit=lambda d: 10 * GIB, measure=lambda m: 2 * m * GIB)
    (micro, accum), note = d.value, d.note
    assert (micro, accum) == (4, 4) and note.startswith("batch_size auto: 4 x 32 tokens per micro-step, 4 micro-steps")


# ---------------------------------------------------------------------------------------- config

@pytest.mark.parametrize("argv,pattern", [
    (["--train.batch_size=foo"], r"^train.batch_size must be a positive integer or auto, got 'foo'$"),
    (["--train.batch_size=2.5"], r"^train.batch_size must be a positive integer or auto, got '2.5'$"),
    (["--train.batch_size=0"], r"^train.batch_size must be >= 1, got 0$"),
    (["--train.batch_size=auto"], r"^train.batch_size auto needs train.global_batch_size, the sequences per optimizer "
                                  r"step over all ranks: e.g. --train.global_batch_size=512 \(gpt2_124m's 16 x 32\)$"),
    (["--train.batch_size=4", "--train.grad_accum_steps=2", "--train.global_batch_size=16"],
     r"^train.global_batch_size=16 disagrees with train.batch_size x train.grad_accum_steps = 4 x 2; set one of them"),
    (["--train.global_batch_size=-1"], r"^train.global_batch_size must be >= 0, got -1$"),
])
def test_bad_batch_settings_are_one_line(argv, pattern):
    with pytest.raises(UserError, match=pattern) as e:
        load_config(argv)
    assert "\n" not in str(e.value)


def test_batch_size_reads_integers_and_auto_from_the_command_line_and_yaml(tmp_path):
    assert load_config(["--train.batch_size=5e1"]).train.batch_size == 50
    assert load_config(["--train.batch_size= 7 "]).train.batch_size == 7
    assert load_config(["--train.batch_size=8", "--train.grad_accum_steps=4", "--train.global_batch_size=32"]).train \
        .global_batch_size == 32  # agreeing is fine
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  batch_size: auto\n  global_batch_size: 512\n")
    t = load_config(["--config", str(path)]).train
    assert (t.batch_size, t.global_batch_size) == ("auto", 512)
    path.write_text("train:\n  batch_size: [4]\n")
    with pytest.raises(UserError, match=r"train.batch_size expects an int or a string, got \[4\]"):
        load_config(["--config", str(path)])


def test_a_global_batch_the_ranks_cannot_share_is_one_line(tmp_path, data_root, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(UserError, match=r"^train.global_batch_size=18 is not divisible by the 4 ranks, so they cannot "
                                        r"share it; run on 1, 2, 3, 6, 9, 18 rank\(s\), or \(a new run\) set "
                                        r"train.global_batch_size to a multiple of 4$") as e:
        loop.train(load_config(_argv(tmp_path / "out", data_root, "--train.batch_size=auto",
                                      "--train.global_batch_size=18")))
    assert "\n" not in str(e.value)
    check_world_size(_auto("--train.global_batch_size=16"), 4)  # 4 each


def test_the_memory_check_of_an_auto_run_is_at_one_sequence(monkeypatch):
    import runtime.memory
    from training.builders import check_memory

    cfg = load_config(["--train.batch_size=auto", "--train.global_batch_size=512", "--train.device=cpu"])
    monkeypatch.setattr(runtime.memory, "available_bytes", lambda device: 2**40)
    check_memory(cfg, 65, None, torch.device("cpu"))  # "auto" is no crash
    monkeypatch.setattr(runtime.memory, "available_bytes", lambda device: 1)
    with pytest.raises(UserError, match=r"^training \(batch_size auto, at 1 sequence per micro-step\) needs about .* "
                                        r"lower model.block_size, or the model's size") as e:
        check_memory(cfg, 65, None, torch.device("cpu"))
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------ end to end

def _argv(out, data_root, *extra):
    return tiny_argv(out, data_root, "--train.max_iters=12", "--train.warmup_iters=2", "--train.eval_interval=4",
                     "--train.eval_iters=2", "--model.dropout=0.1", *extra)


AUTO = ("--train.batch_size=auto", "--train.global_batch_size=16")


def _inject(monkeypatch, limit_gib, calls=None):
    """A memory limit of limit_gib GiB, and a micro-batch of m sequences that needs m GiB."""
    def estimated(*a, **k):
        def measure(m):
            if calls is None:
                pytest.fail("a resumed run must not measure")
            calls.append(m)
            return m * GIB
        return measure
    monkeypatch.setattr(training.batch_size, "memory_limit", lambda device: limit_gib * GIB)
    monkeypatch.setattr(training.batch_size, "estimated_bytes", estimated)


def test_an_auto_run_times_the_loss_product_for_the_micro_batch_it_chose(tmp_path, data_root, monkeypatch):
    import training.builders

    asked = []
    monkeypatch.setattr(training.builders, "choose_weight_grad_product",
                        lambda device, **kw: asked.append(kw) or ("torch.mm", ""))
    _inject(monkeypatch, 10, [])  # 8 sequences fit
    loop.train(load_config(_argv(tmp_path / "out", data_root, *AUTO, "--data.tokenizer=gpt2", "--train.max_iters=2")))
    assert [(k["rows"], k["chunks"]) for k in asked] == [(8 * 32, 1)]  # once, for 8 sequences of 32 tokens


def test_an_auto_run_trains_as_the_batch_it_chose_and_resumes_it_under_another_limit(tmp_path, data_root,
                                                                                     monkeypatch, capsys):
    # 16 sequences per step on 1 rank: divisors 1, 2, 4, 8, 16; m GiB against 90% of 10 GiB: 8 fits, 16 does not
    calls = []
    _inject(monkeypatch, 10, calls)
    full = loop.train(load_config(_argv(tmp_path / "full", data_root, *AUTO)))
    assert calls and max(calls) == 16 and 8 in calls
    out = capsys.readouterr().out
    assert ("batch_size auto: 8 x 32 tokens per micro-step, 2 micro-steps (global 16 sequences), peak 8.0 GiB of 10.0 GiB "
            "estimated (no peak can be measured on cpu)") in out
    assert "512 tokens/step (8 x 32 x 2 micro-steps)" in out
    ck = load_checkpoint(tmp_path / "full")
    assert ck["plan"]["micro_batch"] == 8 and ck["train"]["tokens_seen"] == 12 * 16 * 32
    assert ck["config"]["train"]["batch_size"] == "auto"  # the config as the user wrote it

    # the same run written out by hand: batch_size 8, 2 micro-steps
    by_hand = loop.train(load_config(_argv(tmp_path / "by_hand", data_root, "--train.batch_size=8",
                                            "--train.grad_accum_steps=2")))
    assert by_hand["losses"] == full["losses"]

    calls.clear()
    with inject(interrupt_after=5):
        part1 = loop.train(load_config(_argv(tmp_path / "resumed", data_root, *AUTO)))
    assert part1["iter"] == 5 and calls
    capsys.readouterr()
    _inject(monkeypatch, 100)  # now 16 would fit; the resumed run must keep 8 and not measure
    part2 = loop.train(load_config(_argv(tmp_path / "resumed", data_root, *AUTO)))
    out = capsys.readouterr().out
    assert "batch_size auto: 8 x 32 tokens per micro-step" in out and "(decided when this run started)" in out
    assert {**part1["losses"], **part2["losses"]} == full["losses"]
    assert load_checkpoint(tmp_path / "resumed")["plan"]["micro_batch"] == 8


def test_the_measure_runs_a_real_forward_backward_at_the_size_and_leaves_the_run_as_it_was(monkeypatch):
    """measured_bytes on a CPU, with CUDA's peak counters stood in for: the model sees m sequences of the
    block size, the gradients are dropped, the global RNG is untouched, and the peak + extra comes back;
    an out-of-memory error in the backward leaves no gradients behind either."""
    from model import GPT, GPTConfig
    from training.batch_size import measured_bytes

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 1000)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=65, dropout=0.1))
    shapes = []
    model.register_forward_pre_hook(lambda mod, args: shapes.append(tuple(args[0].shape)))
    rng = torch.get_rng_state()
    measure = measured_bytes(model, LMLoss(), torch.device("cpu"), torch.float32, block_size=32, vocab_size=65, extra=24)
    assert measure(3) == 1024 and shapes == [(3, 32)]
    assert torch.equal(torch.get_rng_state(), rng) and all(p.grad is None for p in model.parameters())

    def oom(*a):
        raise torch.OutOfMemoryError("CUDA out of memory")
    model.transformer.h[0].register_full_backward_pre_hook(oom)
    with pytest.raises(torch.OutOfMemoryError):
        measure(2)
    assert all(p.grad is None for p in model.parameters())


def test_the_measure_runs_the_loss_in_chunks_where_a_compiled_run_has_full_logits(monkeypatch):
    """A compiled GPU run's loss is the full logits (LMLoss()), which the eager probe would run as eager
    cross-entropy with fp32 copies the compiled step never holds (an H100, 2026-11-28: 16.3 GiB probed at
    16 x 1024 against 9.2 real, so 16 GB got half the micro-batch that fits). The probe runs that loss in
    chunks, plus the one (m, T, V) copy of the logits in the compute dtype that the compiled step keeps (the
    real steps' peak grew by that much a sequence more than the chunked probe's); a loss already in chunks (an
    eager run's) is probed as it is. The reference: the loss the forward+backward receives, and the logits'
    bytes by hand (2 sequences x 32 positions x 50304 x 4 bytes of fp32; 2 bytes under bf16)."""
    import training.batch_size as batch_size
    from model import GPT, GPTConfig

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 0)
    seen = []
    probe = batch_size.forward_backward_probe
    monkeypatch.setattr(batch_size, "forward_backward_probe", lambda m, loss, *a: seen.append(loss) or probe(m, loss, *a))
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=50304, dropout=0.0))
    peaks = [batch_size.measured_bytes(model, loss, torch.device("cpu"), dtype, block_size=32, vocab_size=50304,
                                       extra=7)(2)
             for loss, dtype in ((LMLoss(), torch.float32), (LMLoss(), torch.bfloat16), (LMLoss(chunk_rows=96), torch.float32))]
    assert seen[0].chunk_rows is not None and seen[0].chunk_rows >= 64, seen[0]  # 2 x 32 = 64 rows: one chunk or more
    assert seen[2] == LMLoss(chunk_rows=96)
    assert peaks == [2 * 32 * 50304 * 4 + 7, 2 * 32 * 50304 * 2 + 7, 7]
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("argv", [["--train.batch_size=4"], ["--train.batch_size=6", "--train.grad_accum_steps=3"],
                                  ["--train.batch_size=5", "--train.grad_accum_steps=2"]])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_eval_batches_are_the_same_sequences_on_any_number_of_ranks(data_root, argv, world):
    # found from outside: the eval loaders took the per-rank micro-batch, so 2 ranks evaluated other sequences
    # than 1 (val 10.8087 against 10.8132 at the same weights), and a run resumed on another number of ranks
    # compared its val loss, and chose best.pt, against another eval set
    from training.builders import data_loaders, fixed_batch
    from training.config.sections import load_config
    from training.parallel.distributed import Parallel

    cfg = load_config(["--data.tokenizer=char", f"--data.root={data_root}", "--model.block_size=16", *argv])
    batches = []
    for ranks in (1, world):
        par = Parallel(0, 0, ranks)
        micro = fixed_batch(cfg.train, par).value.micro_batch
        prepared = data_root / next(p.name for p in data_root.iterdir() if p.is_dir())
        _, evals = data_loaders(cfg, prepared, par, torch.device("cpu"))(micro)
        batches.append({split: [loader.get_batch(k)[0] for k in range(3)] for split, loader in evals.items()})
    for split in ("train", "val"):
        for one, many in zip(batches[0][split], batches[1][split]):
            assert torch.equal(one, many), split
