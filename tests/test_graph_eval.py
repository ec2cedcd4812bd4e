"""The evals' forwards as CUDA graphs (training/graphs/evals.py) on the CPU: uncaptured (the same static buffers
and calls) and through the capture path under a graph's rules (tests/cuda_graphs.py), against the eager
forwards of training/report/evaluate.py on the same batches: equal bit for bit, for both batch shapes an
eval takes, after the weights move in place and after they are replaced; a capture that fails or a replay that
disagrees goes eager in one line. (A whole run with graphed evals against the eager run: tests/test_graph_step.py.)"""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from cuda_graphs import FakeGraph
from model import GPT, GPTConfig
from runtime.loss_path import LMLoss
from runtime.precision import make_scaler
from training.graphs.evals import GraphedLoss
from training.optim import make_optimizers
from training.report.evaluate import evaluate, evaluate_full
from training.step import train_step

GPU_CHUNKS = LMLoss(chunk_rows=16, always_shift=True)  # the fused head + loss as a GPU runs it (loss_path)
CHAR_GPU = {"pos_embedding": "rope", "qk_norm": True, "mlp_act": "relu2"}  # shakespeare_char_gpu.yaml's model


def setup(**model_options):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=61, dropout=0.1,
                          **model_options)).train()
    return model, make_optimizers(model, lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95), device_type="cpu")


def one_step(model, optimizers, seed: int) -> None:
    """An optimizer step: the weights move in place."""
    g = torch.Generator().manual_seed(seed)
    batch = [(torch.randint(0, 61, (3, 16), generator=g), torch.randint(0, 61, (3, 16), generator=g))]
    train_step(model, GPU_CHUNKS, optimizers, make_scaler(torch.device("cpu"), torch.float32), batch,
               amp=contextlib.nullcontext, grad_clip=0.5)


class Batches:
    """A loader's eval interface over fixed random batches: get_batch(k, 0), and the split read in order with
    a short last batch (evaluate_full)."""
    def __init__(self, n: int = 7, size: int = 3):
        g = torch.Generator().manual_seed(5)
        self.x = torch.randint(0, 61, (n, 16), generator=g)
        self.y = torch.randint(0, 61, (n, 16), generator=g)
        self.batch_size = size

    def get_batch(self, k, micro):
        rows = torch.arange(k, k + self.batch_size) % len(self.x)
        return self.x[rows], self.y[rows]

    def num_windows(self):
        return len(self.x)

    def sequential_batch(self, k):
        rows = slice(k * self.batch_size, (k + 1) * self.batch_size)
        return self.x[rows], self.y[rows]


def eval_both(model, loss, graphed, amp=contextlib.nullcontext) -> list:
    """[the eager evals, the graphed ones]: random batches of two splits, then the whole split in order (its
    last batch another shape), each forward in a fresh `amp` context as a run's evals are."""
    loaders = {"train": Batches(), "val": Batches(5)}
    return [(evaluate(model, fn, loaders, 4, amp), evaluate_full(model, fn, loaders["val"], amp))
            for fn in (loss, graphed)]


BF16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731  (runtime/precision.autocast's, in bf16)


@pytest.mark.parametrize("capture", [False, True], ids=["uncaptured", "capture-emulated"])
@pytest.mark.parametrize("options, amp", [({}, contextlib.nullcontext), (CHAR_GPU, contextlib.nullcontext),
                                          (CHAR_GPU, BF16)], ids=["gpt2", "char-gpu", "char-gpu-bf16"])
def test_graphed_evals_equal_the_eager_evals(capture, options, amp, request):
    """Bit for bit the eager forwards' losses, for both batch shapes; after the weights move in place (an
    optimizer step: the replays read them where they are, and nothing is recorded again; under bf16 autocast
    too, whose cache of cast weights, filled by the eager forward before the capture, must not be what the
    graph reads); after they are replaced by new tensors (load_state_dict with assign: every shape recorded
    again); and in training mode (dropout on) it is the plain loss."""
    graphs = request.getfixturevalue("fake_cuda_graphs") if capture else None
    model, opts = setup(**options)
    graphed = GraphedLoss(GPU_CHUNKS, capture=capture, say=pytest.fail)
    kept = []
    for round_ in range(3):
        eager, got = eval_both(model, GPU_CHUNKS, graphed, amp)
        assert eager == got
        kept.append(graphed.shapes[((3, 16), torch.int64, (3, 16), torch.int64)])  # 9 calls an eval
        assert len(graphed.shapes) == 2 and (kept[-1].graph is not None) == capture and not kept[-1].unchecked
        one_step(model, opts, round_)
        if round_ == 1:
            model.load_state_dict(copy.deepcopy(model.state_dict()), assign=True)
    assert kept[0] is kept[1] and kept[2] is not kept[1] and not graphed.eager
    if capture:
        assert graphs.replays >= 3 * 7
    model.train()
    x, y = Batches().get_batch(0, 0)
    with torch.no_grad():
        torch.manual_seed(0)
        a = graphed(model, x, y)
        torch.manual_seed(0)
        b = GPU_CHUNKS(model, x, y)
    assert torch.equal(a, b) and len(graphed.shapes) == 2


@pytest.mark.parametrize("fault, said", [
    ("refused", "the capture failed (CaptureRefused: operation not permitted when stream is capturing"),
    ("replays nothing", "a replay's loss"),
])
def test_graphed_evals_that_fail_go_eager_in_one_line(fault, said, fake_cuda_graphs, monkeypatch):
    """A capture refused (the CPU's fused loss checks its sums on the host; a GPU's never does), or a graph
    that replays nothing (its output holds the recorded batch's loss): one line, and every eval equals the
    eager one, then and after."""
    loss = GPU_CHUNKS
    if fault == "refused":
        loss = LMLoss(chunk_rows=16)
    else:
        monkeypatch.setattr(FakeGraph, "replay", lambda self: None)
    model, _ = setup()
    lines = []
    graphed = GraphedLoss(loss, capture=True, say=lines.append)
    for _ in range(2):
        eager, got = eval_both(model, loss, graphed)
        assert eager == got
    assert graphed.eager and len(lines) == 1 and said in lines[0], lines
