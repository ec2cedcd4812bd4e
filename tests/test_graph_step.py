"""The graphed training step (training/graphs/step.py), which a GPU replays as one CUDA graph, on the CPU: run
uncaptured (the same static buffers, tensor learning rates and calls), and through its capture path with
torch.cuda's capture emulated under a graph's rules (each op kept with its tensors by reference and its
numbers by value, replayed as recorded). Against the eager train_step from the same weights, on the same
batches and dropout streams, under a changing learning rate: AdamW's steps equal it bit for bit, Muon's (which
multiplies by its rate on the device instead of a float) to float rounding, also after the state is put back
as the time budget does. The recorded step reads nothing on the host (a capture would fail on it), a run with
it trains and resumes as the eager run, and the run plan's rule says where the graph runs."""
from __future__ import annotations

import contextlib
import copy
import json
import math

import pytest
import torch

from training import loop
from cuda_graphs import FakeGraph, HostReads
from checkpoint import load_checkpoint
from model import GPT, GPTConfig
from runtime.loss_path import LMLoss
from runtime.precision import make_scaler
from training.builders import step_graph_for
from training import builders
from training.config.sections import load_config
from training.plan import Decision
from training.graphs.evals import GraphedLoss
from training.graphs.step import WARMUP_STEPS, GraphedStep, _disagreement
from training.optim import make_optimizers
from training.parallel.distributed import Parallel
from training.step import StepOutput, train_step
from training.timing.schedule import apply_lr, lr_at

LR = 3e-3


CHAR_GPU = {"pos_embedding": "rope", "qk_norm": True, "mlp_act": "relu2"}  # shakespeare_char_gpu.yaml's model


def setup(kind: str, **model_options):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=61, dropout=0.1,
                          **model_options)).train()
    return model, make_optimizers(model, lr=LR, weight_decay=0.1, betas=(0.9, 0.95), device_type="cpu", kind=kind,
                                  muon_lr=0.02, ns_dtype=torch.float32)


def bound_step(model, optimizers, loss=LMLoss(), amp=contextlib.nullcontext):
    scaler = make_scaler(torch.device("cpu"), torch.float32)
    return lambda batches: train_step(model, loss, optimizers, scaler, batches, amp=amp, grad_clip=0.5)


def batches_at(i: int, accum: int = 2):
    g = torch.Generator().manual_seed(100 + i)
    out = []
    for _ in range(accum):
        x = torch.randint(0, 61, (3, 16), generator=g)
        y = torch.randint(0, 61, (3, 16), generator=g)
        y[0, :5] = -1  # some targets not counted, as a conversation's are
        out.append((x, y))
    return out


def run(step, optimizers, steps: int, seed: int = 7) -> list[StepOutput]:
    torch.manual_seed(seed)  # dropout's stream
    outs = []
    for i in range(steps):
        apply_lr(optimizers, lr_at(i, lr=LR, min_lr=LR / 10, warmup_iters=3, max_iters=steps), LR)
        outs.append(step(batches_at(i)))
    return outs


@pytest.mark.parametrize("kind", ["adamw", "muon"])
def test_static_step_equals_the_eager_step(kind):
    model, opts = setup(kind)
    twin, twin_opts = copy.deepcopy(model), None
    twin_opts = make_optimizers(twin, lr=LR, weight_decay=0.1, betas=(0.9, 0.95), device_type="cpu", kind=kind,
                                muon_lr=0.02, ns_dtype=torch.float32)
    eager = run(bound_step(model, opts), opts, 8)
    graphed = GraphedStep(bound_step(twin, twin_opts), twin_opts, twin, capture=False, say=print)
    static = run(graphed, twin_opts, 8)
    assert graphed.static and graphed.rates  # it ran on its own buffers
    for e, s in zip(eager, static):
        if kind == "adamw":
            assert torch.equal(e.loss, s.loss) and torch.equal(e.grad_norm, s.grad_norm)
        else:
            torch.testing.assert_close(s.loss, e.loss, rtol=1e-5, atol=0)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        if kind == "adamw":
            assert torch.equal(p, q), name
        else:
            # float rounding (~1e-7), which Adam's normalised step may lift to ~1e-6 where a gradient is ~0
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-5, msg=name)
    # the floats are back: the log and the checkpoint see the schedule's numbers, never the device tensors
    assert all(isinstance(g["lr"], float) for o in twin_opts for g in o.param_groups)



@pytest.mark.parametrize("kind, loss, options", [
    ("adamw", LMLoss(), {}), ("muon", LMLoss(), CHAR_GPU), ("adamw", LMLoss(chunk_rows=16, always_shift=True), {}),
    ("muon", LMLoss(), {"norm": "rmsnorm", "mlp_act": "swiglu", "tie_embeddings": False, "logit_softcap": 15.0})],
    ids=["adamw", "muon-char-gpu", "fused-chunks", "modern"])
def test_the_recorded_step_reads_nothing_on_the_host(kind, loss, options):
    """Both loss paths a GPU's eager step takes: the full logits (a small vocabulary) and the fused head in
    chunks as a GPU runs them (runtime/loss_path.py's loss_path: no exp blocks, each chunk shifted by its max
    without a host check)."""
    model, opts = setup(kind, **options)
    graphed = GraphedStep(bound_step(model, opts, loss), opts, model, capture=False, say=print)
    run(graphed, opts, WARMUP_STEPS + 1)  # the state made, the buffers recorded
    with HostReads() as mode:
        graphed._rated(graphed.static)
    assert mode.seen == []
    with HostReads() as mode:  # the mode does see them: a float() of a loss is one
        float(graphed._rated(graphed.static).loss)
    assert mode.seen == ["_local_scalar_dense"]


@pytest.mark.parametrize("argv, device, world, expected", [
    ([], "cpu", 1, (False, "")),
    ([], "cuda", 1, (True, "replayed as CUDA graphs")),
    (["--train.cuda_graph=false"], "cuda", 1, (False, "")),
    (["--train.compile=true"], "cuda", 1, (False, "")),
    ([], "cuda", 2, (False, "several ranks")),
    (["--train.dtype=float16"], "cuda", 1, (False, "float16")),
    (["--train.activation_checkpointing=true"], "cuda", 1, (False, "activation checkpointing")),
    (["--train.batch_size=auto", "--train.global_batch_size=64"], "cuda", 1, (False, "batch_size auto")),
])
def test_the_plan_graphs_the_step_where_nothing_in_it_needs_the_host(argv, device, world, expected):
    cfg = load_config(argv)
    par = Parallel(world_size=world) if world > 1 else Parallel()
    dtype = torch.float16 if "float16" in " ".join(argv) else torch.bfloat16
    d = step_graph_for(cfg, par, torch.device(device), dtype)
    assert d.value is expected[0] and expected[1] in d.note


def test_a_disagreeing_first_replay_is_named():
    p0 = [torch.zeros(3)]
    after = [torch.full((3,), 1e-3)]
    same = StepOutput(torch.tensor(2.0), torch.tensor(1.0))
    assert _disagreement(same, same, p0, after, after) == ""
    assert "loss" in _disagreement(same, StepOutput(torch.tensor(2.5), torch.tensor(1.0)), p0, after, after)
    nan_norm = StepOutput(torch.tensor(2.0), torch.tensor(math.nan))
    assert "gradient norm" in _disagreement(same, nan_norm, p0, after, after)
    assert "update" in _disagreement(same, same, p0, after, [torch.full((3,), 2e-3)])


@pytest.mark.parametrize("capture", [False, True], ids=["uncaptured", "capture-emulated"])
def test_a_run_with_the_graphed_step_trains_as_the_eager_run(capture, tmp_path, data_root, monkeypatch, request):
    """train.py with the plan's step_graph on (forced: this is a CPU), its step and evals uncaptured or through
    the capture path under a graph's rules (fake_cuda_graphs: tests/cuda_graphs.py): with evals between steps,
    a time budget's timed steps put back, and a resume, the same losses, evals and checkpoints as the eager
    runs, bit for bit."""
    def argv(out, iters, *extra):
        return ["--data.tokenizer=char", f"--data.root={data_root}", f"--train.out_dir={out}", "--model.n_layer=1",
                "--model.n_head=2", "--model.n_embd=32", "--model.block_size=16", "--model.dropout=0.1",
                "--train.batch_size=4", "--train.grad_accum_steps=2", f"--train.max_iters={iters}",
                "--train.warmup_iters=3", "--train.lr=3e-3", "--train.eval_interval=3", "--train.eval_iters=2",
                "--train.log_interval=1", "--train.dtype=float32", "--train.device=cpu", "--train.peak_flops=1e11",
                "--wandb.mode=disabled", *extra]

    def runs(name):  # a budget large enough to keep max_iters (its timing steps, then puts all back); a resume
        budget = loop.train(load_config(argv(tmp_path / f"{name}-budget", 8, "--train.time_budget=1h")))
        loop.train(load_config(argv(tmp_path / name, 5)))
        return budget, loop.train(load_config(argv(tmp_path / name, 10)))

    eager = runs("eager")
    monkeypatch.setattr(builders, "step_graph_for", lambda *a: Decision(True, "graphed (forced by the test)"))
    if capture:
        request.getfixturevalue("fake_cuda_graphs")
        monkeypatch.setattr(builders, "GraphedStep", lambda *a, capture, **k: GraphedStep(*a, capture=True, **k))
    evals = []  # the graphed evals of each run
    monkeypatch.setattr(builders, "GraphedLoss", lambda loss, say, **_: evals.append(
        GraphedLoss(loss, capture=capture, say=say)) or evals[-1])
    graphed = runs("graphed")
    assert len(evals) == 3 and not any(e.eager for e in evals)
    assert all(any(s.graph is not None for s in e.shapes.values()) == capture for e in evals if e.shapes)
    for e, g in zip(eager, graphed):
        assert e["losses"] == g["losses"] and e["eval"] == g["eval"]
    for run_ in ("-budget", ""):  # every eval of the run: its forwards graphed too (training/graphs/evals.py)
        evals = [[{k: v for k, v in row.items() if k.startswith(("val/", "eval/"))}
                  for row in map(json.loads, (tmp_path / f"{name}{run_}" / "metrics.jsonl").read_text().splitlines())
                  if "val/loss" in row] for name in ("eager", "graphed")]
        assert evals[0] == evals[1] and len(evals[0]) >= 2
    assert len(graphed[0]["losses"]) == 8 and len(graphed[1]["losses"]) == 5
    if capture:  # the graph did replay
        assert FakeGraph.replays > 0
    for run_ in ("-budget", ""):
        a, b = load_checkpoint(tmp_path / f"eager{run_}"), load_checkpoint(tmp_path / f"graphed{run_}")
        for part in ("model", "optimizer"):  # every tensor (and number) of the nested state, exactly
            torch.testing.assert_close(b[part], a[part], rtol=0, atol=0, msg=part)


def twins(kind):
    model, opts = setup(kind)
    twin = copy.deepcopy(model)
    return model, opts, twin, make_optimizers(twin, lr=LR, weight_decay=0.1, betas=(0.9, 0.95), device_type="cpu",
                                              kind=kind, muon_lr=0.02, ns_dtype=torch.float32)


GPU_CHUNKS = LMLoss(chunk_rows=16, always_shift=True)  # the fused head + loss as a GPU runs it (loss_path)


@pytest.mark.parametrize("kind, loss", [("adamw", LMLoss()), ("muon", LMLoss()), ("adamw", GPU_CHUNKS),
                                        ("muon", GPU_CHUNKS)], ids=["adamw", "muon", "adamw-chunks", "muon-chunks"])
def test_replays_with_a_graphs_semantics_equal_the_eager_steps(kind, loss, fake_cuda_graphs, monkeypatch):
    """The capture path (warm-up, snapshot, check, record, replay) under a graph's rules: a number read on the
    host while recording would be replayed as it was, a tensor replaced after it would be left unwritten.
    With the rate changing every step and dropout drawing anew at each replay, the steps equal the eager ones
    (AdamW bit for bit, Muon to rounding); then again after the state is put back to before the first step,
    as the time budget does (load_state_dict: new tensors, new param groups, no optimizer state)."""
    model, opts, twin, twin_opts = twins(kind)
    graphed = GraphedStep(bound_step(twin, twin_opts, loss), twin_opts, twin, capture=True, say=pytest.fail)
    records, real_record = [], GraphedStep._record

    def record(self, batches):  # a capture on a state not yet made would record its zero-fill, replayed each step
        records.append([len(o.state) for o in twin_opts])
        return real_record(self, batches)
    monkeypatch.setattr(GraphedStep, "_record", record)
    start = [(copy.deepcopy(m.state_dict()), [copy.deepcopy(o.state_dict()) for o in os_])
             for m, os_ in ((model, opts), (twin, twin_opts))]
    for round_ in range(2):
        eager = run(bound_step(model, opts, loss), opts, 9, seed=round_)
        static = run(graphed, twin_opts, 9, seed=round_)
        for e, s in zip(eager, static):
            if kind == "adamw":
                assert torch.equal(e.loss, s.loss) and torch.equal(e.grad_norm, s.grad_norm)
            else:
                torch.testing.assert_close(s.loss, e.loss, rtol=1e-5, atol=0)
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(q, p, rtol=0 if kind == "adamw" else 1e-5, atol=0 if kind == "adamw" else 1e-5)
        for (m_state, o_states), (m, os_) in zip(start, ((model, opts), (twin, twin_opts))):
            m.load_state_dict(m_state)
            for o, st in zip(os_, o_states):
                o.load_state_dict(st)
    assert fake_cuda_graphs.replays >= 8 and graphed.graph is not None and not graphed.eager
    assert len(records) == 2 and all(all(records_) for records_ in records), records  # each round: once, state made


def gone_eager(steps: int, loss=LMLoss()) -> tuple[GraphedStep, list[str]]:
    """A graphed AdamW run beside the eager one, `steps` steps: every step must equal the eager run's (the
    fallback puts the state back before it goes on). Returns the graphed step and what it said."""
    model, opts, twin, twin_opts = twins("adamw")
    said = []
    graphed = GraphedStep(bound_step(twin, twin_opts, loss), twin_opts, twin, capture=True, say=said.append)
    eager, static = run(bound_step(model, opts, loss), opts, steps), run(graphed, twin_opts, steps)
    assert [e.loss for e in eager] == [s.loss for s in static]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))
    assert graphed.eager and graphed.graph is None and len(said) == 1, said
    return graphed, said


def test_a_replay_that_disagrees_with_the_eager_step_goes_eager_in_one_line(fake_cuda_graphs, monkeypatch):
    """A graph that replays nothing (a broken capture): its first replay leaves the outputs as a capture does
    (never computed) and the weights unmoved. The check sees it, says so in one line, puts the state back and
    goes on eagerly: every step then equals the eager run's."""
    monkeypatch.setattr(FakeGraph, "replay", lambda self: None)
    _, said = gone_eager(7)
    assert "differs from the eager step's" in said[0]


def test_a_capture_that_is_refused_goes_eager_in_one_line(fake_cuda_graphs):
    """The CPU's fused loss checks its sums on the host, which a capture refuses (a GPU's never does:
    always_shift). The capture fails; the run says so in one line, its stream is the run's again (the fixture
    checks), and every step equals the eager run's."""
    _, said = gone_eager(6, LMLoss(chunk_rows=16))
    assert "the capture failed (CaptureRefused: operation not permitted when stream is capturing" in said[0]


def test_a_graph_whose_dropout_repeats_is_caught_at_its_second_replay(fake_cuda_graphs, monkeypatch):
    """A graph whose replays draw the same dropout masks each time (as if the RNG's offset were baked in):
    its first replay equals the eager step, its second does not. The second check catches it, the run says
    so in one line and goes on eagerly, with every step equal to the eager run's."""
    real = FakeGraph.replay
    first_rng = []

    def replay_same_masks(self):
        first_rng.append(torch.get_rng_state()) if not first_rng else torch.set_rng_state(first_rng[0])
        real(self)
    monkeypatch.setattr(FakeGraph, "replay", replay_same_masks)
    _, said = gone_eager(8)
    assert FakeGraph.replays == 2 and "a replay's loss" in said[0]


def test_replays_under_bf16_autocast_equal_the_eager_steps(fake_cuda_graphs):
    """train_step enters autocast afresh for each micro-batch, inside the capture: its casts of the weights are
    recorded and redone by each replay (a cast cached before the capture would be replayed as it was; the
    graphed evals had that bug: tests/test_graph_eval.py). Bit for bit the eager bf16 steps."""
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    model, opts, twin, twin_opts = twins("adamw")
    graphed = GraphedStep(bound_step(twin, twin_opts, GPU_CHUNKS, bf16), twin_opts, twin, capture=True,
                          say=pytest.fail)
    eager, static = run(bound_step(model, opts, GPU_CHUNKS, bf16), opts, 9), run(graphed, twin_opts, 9)
    assert [e.loss for e in eager] == [s.loss for s in static] and fake_cuda_graphs.replays >= 5
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))
