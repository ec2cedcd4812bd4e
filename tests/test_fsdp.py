"""Fully sharded training (train.parallel=fsdp) and its sharded checkpoints, run for real: 2 gloo ranks
on the CPU (with the environment torchrun gives them: tests/multirank_runs.py), and single processes. FSDP
trains what DDP trains; a checkpoint written by N ranks resumes on M and continues the same trajectory;
inference reads it with no process group; a kill mid-save keeps the previous checkpoint."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference import sample_cli
from training import loop
from checkpoint import load_checkpoint, load_model
from checkpoint.__main__ import consolidate
from errors import UserError, run_cli
from faults import inject
from model import GPT, GPTConfig
from runtime.loss_path import LMLoss
from runtime.memory import training_bytes
from training.config.sections import load_config
from training.parallel.sharding import checkpoint_blocks

from multirank_runs import argv as multirank_argv, hellaswag_during_training_equals_the_whole, losses, two_ranks

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
TOL = 1e-5
LOSS = LMLoss()  # the full logits' loss
CLIP = 0.1  # below every step's gradient norm here: clipping acts on every step


def argv(out: Path, data_root: Path, *extra: str) -> list[str]:
    # test_multirank's tiny run, without dropout (on another number of ranks each rank draws other masks,
    # training/state.py, so only a run without dropout can be compared across world sizes), clipping on
    # every step, sharded; later overrides win
    return multirank_argv(out, data_root, "--model.dropout=0.0", f"--train.grad_clip={CLIP}", "--train.parallel=fsdp",
                          *extra)


def one_process(args: list[str], **faults) -> dict:
    with inject(**faults):
        return loop.train(load_config(args))


def weights(out) -> dict[str, torch.Tensor]:
    return load_model(str(out)).model.state_dict()


def max_dw(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, data_root) -> Path:
    """An uninterrupted 2-rank FSDP run: the trajectory the resumed runs must continue."""
    out = tmp_path_factory.mktemp("fsdp") / "out"
    r = two_ranks(argv(out, data_root))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fsdp: 2 ranks, " in r.stdout and " parameters on this rank, " in r.stdout
    return out


# ------------------------------------------------------------------------------------------ training

def clipped_every_step(out: Path) -> bool:
    norms = [r["grad_norm"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "grad_norm" in r]
    return min(norms) > CLIP


def test_fsdp_trains_the_same_losses_and_weights_as_ddp(tmp_path, data_root, fsdp_run):
    """From the same init on the same batches, AdamW, gradients clipped over the shards on every step.
    Not bitwise: the ranks' gradients are summed by a reduce-scatter instead of an all-reduce (max|dw|
    measured 1.5e-7)."""
    r = two_ranks(argv(tmp_path / "ddp", data_root, "--train.parallel=ddp"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "ddp" / "ckpt.pt").is_file() and (fsdp_run / "ckpt.dcp").is_dir()
    a, b = losses(tmp_path / "ddp"), losses(fsdp_run)
    assert a.keys() == b.keys() == set(range(1, 9))
    assert all(abs(a[k] - b[k]) <= TOL for k in a), (a, b)
    assert clipped_every_step(fsdp_run)
    assert max_dw(weights(tmp_path / "ddp"), weights(fsdp_run)) <= TOL


def test_a_two_rank_fsdp_run_with_a_time_budget_finishes_and_resumes_its_plan(tmp_path, data_root):
    """The shipped char configs set train.time_budget, and under FSDP every rank takes part in each eval
    forward: the budget's timing used to evaluate on rank 0 alone, which waited in an all-gather while rank 1
    waited in a broadcast, forever. The timing now runs the loop's own eval (training/run.py); the run
    finishes within its plan, every rank holds the same plan, and a resume keeps it. (Batches of 32: the pass over
    the whole val split, 3,485 windows, took 10 of the test's 20 s in batches of 4.)"""
    out = tmp_path / "out"
    options = ("--train.time_budget=10m", "--train.max_iters=6", "--train.batch_size=32")  # the resume's too
    r = two_ranks(argv(out, data_root, *options, "--train.eval_full=true"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("time budget 10m: ") == 1 and "-> max_iters 6 (config: 6)" in r.stdout  # rank 0 says it
    plan = load_checkpoint(out)["plan"]
    assert plan["max_iters"] == 6 and plan["notes"]["schedule"].startswith("time budget 10m")
    assert max(losses(out)) == 6
    r = two_ranks(argv(out, data_root, *options))  # resumed: nothing to do
    assert r.returncode == 0 and "(decided when this run started)" in r.stdout, r.stderr[-3000:]


def test_muon_on_sharded_matrices_steps_as_on_whole_ones_with_activation_checkpointing(tmp_path, data_root):
    """train.optimizer=muon: Muon for the blocks' matrices (each gathered whole for Newton-Schulz, each
    rank keeping its rows), AdamW for the rest; the FSDP side also recomputes each block in its
    backward. Four steps, equal to DDP's within 1e-5 (not bitwise: the reduce-scatter sums the ranks'
    gradients in another order than the all-reduce, and Newton-Schulz in fp32 carries the last-bit
    difference, measured ~7e-8, through)."""
    extra = ("--train.optimizer=muon", "--train.max_iters=4")
    r = two_ranks(argv(tmp_path / "ddp", data_root, *extra, "--train.parallel=ddp"))
    assert r.returncode == 0, r.stderr[-3000:]
    r = two_ranks(argv(tmp_path / "fsdp", data_root, *extra, "--train.activation_checkpointing=true"))
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = losses(tmp_path / "ddp"), losses(tmp_path / "fsdp")
    assert a.keys() == b.keys() == set(range(1, 5)) and all(abs(a[k] - b[k]) <= TOL for k in a), (a, b)
    assert clipped_every_step(tmp_path / "fsdp")
    assert max_dw(weights(tmp_path / "ddp"), weights(tmp_path / "fsdp")) <= TOL


def test_activation_checkpointing_gives_the_same_gradients():
    """Recomputing each block in the backward (with dropout: the masks are drawn again from the saved
    RNG state) gives the gradients of the plain backward."""
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65, dropout=0.1)
    plain, ckpt = GPT(cfg), GPT(cfg)
    ckpt.load_state_dict(plain.state_dict())
    checkpoint_blocks(ckpt)
    x, y = torch.randint(0, 65, (3, 16)), torch.randint(0, 65, (3, 16))
    for model in (plain, ckpt):
        torch.manual_seed(1)
        LOSS(model, x, y).backward()
    assert list(dict(ckpt.named_parameters())) == list(dict(plain.named_parameters()))  # names unchanged
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=0), name
    assert any(p.grad.abs().sum() > 0 for p in plain.parameters())


def test_activation_checkpointing_under_compile_gives_the_same_gradients():
    """train.compile with train.activation_checkpointing: the recomputation must match what the compiled
    forward saved (the hook-based composable checkpoint raised CheckpointError on the first backward,
    found by tests/matrix.py). aot_eager: Dynamo and AOTAutograd, as Inductor's, without a C++ build."""
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65)
    plain, ckpt = GPT(cfg), GPT(cfg)
    ckpt.load_state_dict(plain.state_dict())
    checkpoint_blocks(ckpt)
    x, y = torch.randint(0, 65, (3, 16)), torch.randint(0, 65, (3, 16))
    LOSS(plain, x, y).backward()
    LOSS(torch.compile(ckpt, backend="aot_eager"), x, y).backward()  # the loss runs inside the compiled forward
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=0), name


@pytest.mark.parametrize("kind", ["adamw", "muon"])
def test_the_sharded_optimizer_state_taken_before_the_first_step_leaves_no_trace(kind):
    """train.time_budget snapshots every state before timing steps, then restores it. torch's
    get_optimizer_state_dict gave the fresh optimizers a step at lr 0 (AdamW's count 1), so an fsdp run
    with a budget trained otherwise than without (found by tests/matrix.py: losses apart from iter 2).
    Reference: the same steps by twin optimizers whose state was never read."""
    import copy

    from training.optim import make_optimizers
    from training.parallel.sharding import ShardedOptimizerState

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=8, vocab_size=11)
    models = [GPT(cfg), GPT(cfg)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [make_optimizers(m, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99), device_type="cpu", kind=kind)
            for m in models]
    x = torch.randint(0, 11, (2, 8))

    def steps(i: int, n: int) -> None:
        for _ in range(n):
            LOSS(models[i], x, x).backward()
            for opt in opts[i]:
                opt.step()
                opt.zero_grad(set_to_none=True)

    state = ShardedOptimizerState(models[1], opts[1])
    snapshot = copy.deepcopy(state.state_dict())  # before any step, as the budget's
    steps(1, 2)  # the "timing" steps
    with torch.no_grad():
        for p, q in zip(models[1].parameters(), models[0].parameters()):
            p.copy_(q)  # the model's own snapshot, restored
    state.load_state_dict(snapshot)
    steps(0, 3)
    steps(1, 3)
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(p, q), name


# ------------------------------------------------------------------------------------------ resume

@pytest.fixture(scope="module")
def killed_run(tmp_path_factory, data_root) -> Path:
    """A 2-rank FSDP run (checkpoint every 2 steps) whose rank 0 was killed in its 3rd sharded save:
    ckpt.dcp/ at iter 2, best.dcp/ at iter 4, and the complete but unpublished ckpt of iter 4 in a temp dir."""
    out = tmp_path_factory.mktemp("killed") / "out"
    # sharded writes: ckpt at iter 2 (1st), best at iter 4 (2nd), ckpt at iter 4 (3rd: killed)
    r = two_ranks(argv(out, data_root, "--train.checkpoint_interval=2"), SMALLGPT_TEST_KILL_IN_SHARDED_SAVE="3")
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]  # rank 0, killed; rank 1 then stopped
    return out


def test_a_two_rank_checkpoint_resumed_on_one_rank_continues_the_trajectory(tmp_path, data_root, fsdp_run,
                                                                              killed_run):
    """2 -> 1: the single process gives itself both ranks' micro-batches (grad_accum_steps is global),
    so it sees the same global batches; DCP gathers the shards into its whole tensors."""
    out = tmp_path / "out"
    shutil.copytree(killed_run, out)
    assert load_checkpoint(out)["train"]["iter"] == 2 and len(load_checkpoint(out)["rng"]["ranks"]) == 2
    one_process(argv(out, data_root, "--train.checkpoint_interval=2"))
    assert load_checkpoint(out)["train"]["iter"] == 8
    assert max_dw(weights(out), weights(fsdp_run)) <= TOL
    a, b = losses(out), losses(fsdp_run)
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) <= TOL for k in a)


def test_a_one_rank_checkpoint_resumed_on_two_ranks_continues_the_trajectory(tmp_path, data_root):
    """1 -> 2: each rank loads its half of every tensor (and of the AdamW moments) from the one
    process's checkpoint, and takes half the micro-batches."""
    one_process(argv(tmp_path / "whole", data_root))
    out = tmp_path / "out"
    one_process(argv(out, data_root), interrupt_after=4)
    assert load_checkpoint(out)["train"]["iter"] == 4
    r = two_ranks(argv(out, data_root))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming" in r.stdout and "1 rank(s), this run has 2" in r.stdout  # the RNG note
    assert max_dw(weights(out), weights(tmp_path / "whole")) <= TOL


def test_a_world_size_that_cannot_keep_the_global_batch_is_refused_in_one_line(tmp_path, data_root, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(UserError) as e:
        loop.train(load_config(argv(tmp_path / "out", data_root, "--train.grad_accum_steps=4")))
    msg = str(e.value)
    assert "\n" not in msg and "not divisible by the 3 ranks" in msg
    assert "run on 1, 2, 4 rank(s)" in msg and "multiple of 3" in msg
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_resuming_with_another_train_parallel_is_refused_in_one_line(tmp_path, data_root):
    """The checkpoint's layout follows train.parallel (ckpt.pt or ckpt.dcp/), so a resume keeps it."""
    out = tmp_path / "out"
    one_process(argv(out, data_root, "--train.max_iters=2", "--train.parallel=ddp"))
    before = (out / "ckpt.pt").read_bytes()
    with pytest.raises(UserError, match=r"config changed in train.parallel: 'ddp' -> 'fsdp'"):
        one_process(argv(out, data_root, "--train.max_iters=4"))
    assert (out / "ckpt.pt").read_bytes() == before and not (out / "ckpt.dcp").exists()


# ------------------------------------------------------------------------------------------ saving

def test_a_kill_mid_save_keeps_the_previous_checkpoint(tmp_path, data_root, fsdp_run, killed_run):
    """Rank 0 dies of SIGKILL with the new checkpoint's shards and state all written to the temp dir,
    before the rename: ckpt.dcp/ still holds the previous one, whole; the next run removes the temp
    dir, resumes from it and ends bitwise where the uninterrupted run ends (exact resume, as with DDP)."""
    out = tmp_path / "out"
    shutil.copytree(killed_run, out)
    assert load_checkpoint(out)["train"]["iter"] == 2
    temps = [p for p in out.iterdir() if p.name.startswith(".ckpt.dcp.") and p.name.endswith(".tmp")]
    assert len(temps) == 1 and (temps[0] / ".metadata").is_file()  # the new one, complete but never published
    r = two_ranks(argv(out, data_root, "--train.checkpoint_interval=2"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "removed 1 leftover temp file" in r.stdout and "resuming" in r.stdout
    assert not any(p.name.endswith(".tmp") for p in out.iterdir())
    assert load_checkpoint(out)["train"]["iter"] == 8
    assert losses(out) == losses(fsdp_run)
    assert max_dw(weights(out), weights(fsdp_run)) == 0


def test_sharded_metadata_that_would_run_code_is_refused(tmp_path, fsdp_run):
    """DCP's .metadata is a pickle: read with an unpickler that admits DCP's own classes only."""
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))
    ckpt = tmp_path / "ckpt.dcp"
    shutil.copytree(fsdp_run / "ckpt.dcp", ckpt)
    (ckpt / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(UserError, match=r"unreadable \.metadata .*open is not allowed"):
        load_model(str(ckpt))
    assert not marker.exists()


# ------------------------------------------------------------------------------------------ inference

def test_sample_greedy_from_the_sharded_checkpoint_equals_the_consolidated_one(tmp_path, fsdp_run, capsys):
    """sample.py reads the 2-rank ckpt.dcp/ in one process with no process group; `python -m
    checkpoint consolidate` writes it as one file; both give the same greedy text, and the weights are
    those the ranks held (gathered by DCP, compared with the shards' own full tensors)."""
    r = subprocess.run([sys.executable, "-m", "checkpoint", "consolidate", str(fsdp_run), "--out", str(tmp_path / "one.pt")],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(f"wrote {tmp_path / 'one.pt'}"), r.stderr[-2000:]
    single = load_checkpoint(tmp_path / "one.pt", needed=("model",))
    assert max_dw(single["model"], weights(fsdp_run)) == 0

    def greedy(spec) -> str:
        with pytest.raises(SystemExit) as exc:
            run_cli(lambda: sample_cli.main(["--checkpoint", str(spec), "--prompt", "ROMEO:", "--temperature", "0",
                                         "--max-new-tokens", "40", "--seed", "1", "--dtype", "float32"]))
        out, err = capsys.readouterr()
        assert exc.value.code in (0, None), err
        return out
    sharded = greedy(fsdp_run)
    assert sharded == greedy(tmp_path / "one.pt") and sharded.startswith("ROMEO:") and len(sharded) > len("ROMEO:")


def test_consolidating_keeps_what_inference_and_the_export_read_a_chat_template_included(tmp_path):
    """A 2-rank FSDP chat fine-tune, consolidated, was "not a chat model": the file kept model, model_config,
    tokenizer, config and train only. Every entry but the training state (this list written by hand) is kept."""
    from checkpoint.format import backend_for
    from serving import make_chat_checkpoint

    make_chat_checkpoint(tmp_path / "chat.pt")
    ck = load_checkpoint(tmp_path / "chat.pt")
    ck |= {"train": {"iter": 3}, "plan": {"dtype": "float32"}, "optimizer": {"optimizers": []}, "scaler": {},
           "loader": {}, "rng": {"ranks": []}}
    sharded = tmp_path / "ckpt.dcp"
    backend_for(sharded).write(sharded, ck)
    one = load_checkpoint(consolidate(sharded, tmp_path / "one.pt"))
    assert set(one) == {"format", "version", "model", "model_config", "tokenizer", "chat_template", "config", "train",
                        "plan"}
    assert one["chat_template"] == ck["chat_template"] and one["plan"] == ck["plan"]


def test_consolidating_a_single_file_checkpoint_is_refused_in_one_line(tmp_path, fsdp_run):
    target = consolidate(fsdp_run, tmp_path / "one.pt")
    with pytest.raises(UserError, match=r"already a single-file checkpoint"):
        consolidate(target)


# ------------------------------------------------------------------------------------------ memory

def test_the_memory_estimate_shares_the_training_state_over_the_ranks():
    cfg = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=50304)
    whole = training_bytes(cfg, batch_size=8, block_size=64, loss_chunk_rows=128)
    quarter = training_bytes(cfg, batch_size=8, block_size=64, loss_chunk_rows=128, shards=4)
    key = "weights, gradients and AdamW state"
    n = sum(p.numel() for p in GPT(cfg).parameters())
    assert whole[key] == 16 * n and quarter[key] == -(-16 * n // 4)  # fp32 weights, grads, two moments
    assert quarter["gathered units (FSDP)"] > 0 and quarter["activations"] == whole["activations"]
    ac = training_bytes(cfg, batch_size=8, block_size=64, loss_chunk_rows=128, activation_checkpointing=True)
    assert ac["activations"] < whole["activations"] / 2


def test_a_run_refused_for_memory_under_ddp_starts_when_sharded(monkeypatch):
    """check_memory counts the rank's share: with 4 ranks' worth of memory between the two estimates,
    DDP is refused in one line that suggests FSDP, and FSDP passes."""
    import runtime.memory
    from training.builders import check_memory
    from training.parallel.distributed import Parallel

    base = ["--model.n_layer=8", "--model.n_embd=256", "--model.n_head=4", "--model.block_size=64",
            "--train.batch_size=2", "--train.device=cpu", "--wandb.mode=disabled"]
    cfg = load_config(base)
    planned = cfg.model.gpt_config(65)
    sizes = {n: sum(training_bytes(planned, batch_size=2, block_size=64, loss_chunk_rows=None, shards=n).values())
             for n in (1, 4)}
    assert sizes[4] < sizes[1] / 2
    monkeypatch.setattr(runtime.memory, "available_bytes", lambda device: int((sizes[1] + sizes[4]) / 2 / 0.9))
    with pytest.raises(UserError) as e:
        check_memory(cfg, 65, None, torch.device("cpu"), Parallel(rank=0, world_size=4, mode="ddp"))
    assert "\n" not in str(e.value) and "--train.parallel=fsdp" in str(e.value)
    check_memory(load_config(base + ["--train.parallel=fsdp"]), 65, None, torch.device("cpu"),
                 Parallel(rank=0, world_size=4, mode="fsdp"))


def test_hellaswag_during_fsdp_training_scores_every_item_once(tmp_path):
    """With FSDP every rank takes part in each forward, so every rank scores all the items (their
    shards could need different numbers of forwards and hang the gathers); the logged accuracy
    equals scoring the final checkpoint in one process."""
    hellaswag_during_training_equals_the_whole(tmp_path, make_argv=argv)
