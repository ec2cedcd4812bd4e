"""torch.cuda's CUDA-graph capture emulated on a CPU, under a graph's rules, for the tests of the graphed
training step and evals (training/graphs/step.py, training/graphs/evals.py): each op recorded with its tensors by
reference and its numbers by value, an op that reads the host refused as a capture refuses it, replay runs
the recorded ops again into the recording's tensors. Use the `fake_cuda_graphs` fixture (import it)."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostReads(TorchDispatchMode):
    """Every op that hands a device value to the host or makes a shape from one: a capture fails on these."""
    HOST = {"_local_scalar_dense", "nonzero", "is_nonzero", "masked_select", "unique", "_unique2", "item", "equal"}

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in self.HOST:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


class CaptureRefused(RuntimeError):
    """What the emulated capture raises where a real one fails: an op that hands a device value to the host."""


class _Recording(TorchDispatchMode):
    """Every aten op of the recorded step, run (a CPU can't defer it) and kept: tensors by reference (a graph
    keeps addresses), everything else by value (a graph keeps the numbers it was launched with). What the
    recording writes in place is put back at its end (a real capture runs nothing). An op that reads a device
    value on the host, or makes a shape from one (a boolean mask's index), is refused, as a capture refuses
    the sync it needs."""

    def __init__(self):
        super().__init__()
        self.ops, self.written = [], {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        masks = name in ("index", "index_put", "index_put_") and any(
            isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in args[1] or ())
        if name in HostReads.HOST or masks or (name == "repeat_interleave" and "output_size" not in kwargs):
            raise CaptureRefused(f"operation not permitted when stream is capturing ({func})")
        for i, arg in enumerate(func._schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            if arg.alias_info is not None and arg.alias_info.is_write:
                for t in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(t, torch.Tensor) and id(t) not in self.written:
                        self.written[id(t)] = (t, t.detach().clone())
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class FakeGraph:
    """torch.cuda.CUDAGraph on a CPU: replay() runs the recorded ops again on the same tensors with the same
    numbers, each fresh result written into the tensor the recording made (where later ops read it)."""
    replays = 0

    def __init__(self):
        self.ops = []

    def replay(self):
        FakeGraph.replays += 1
        with torch.no_grad():
            for func, args, kwargs, out in self.ops:
                result = func(*args, **kwargs)
                if func._schema.returns and func._schema.returns[0].alias_info is not None:
                    continue  # a view or an in-place op: it wrote where the recording's output is
                for o, r in zip(out if isinstance(out, (list, tuple)) else [out],
                                result if isinstance(result, (list, tuple)) else [result]):
                    if isinstance(o, torch.Tensor) and o is not r:
                        o.copy_(r)


class _Stream:
    def wait_stream(self, other):
        pass


DEFAULT_STREAM = _Stream()
_current = [DEFAULT_STREAM]  # the current stream


@contextlib.contextmanager
def _fake_stream(stream):
    """torch.cuda.stream(s): s current inside, and on the way out the stream that was current before."""
    before, _current[0] = _current[0], stream
    try:
        yield
    finally:
        _current[0] = before


@contextlib.contextmanager
def _fake_capture(graph, stream=None, **kwargs):
    """torch.cuda.graph: the capture on its stream; as torch's own exit does, a capture that fails leaves that
    stream current (its exit ends the capture, which raises, before it leaves the stream)."""
    rng = torch.get_rng_state()
    before, _current[0] = _current[0], stream or _Stream()
    rec = _Recording()
    try:
        with rec:
            yield
    finally:
        with torch.no_grad():
            for t, before in reversed(list(rec.written.values())):
                t.copy_(before)
        torch.set_rng_state(rng)  # a capture draws no random numbers: each replay does
    _current[0] = before
    graph.ops = rec.ops


@pytest.fixture
def fake_cuda_graphs(monkeypatch):
    """torch.cuda's capture, streams and RNG as GraphedStep(capture=True) calls them, emulated on the CPU."""
    FakeGraph.replays = 0
    _current[:] = [DEFAULT_STREAM]
    for name, value in {"CUDAGraph": FakeGraph, "graph": _fake_capture, "Stream": _Stream, "graph_pool_handle": object,
                        "current_stream": lambda device=None: _current[0], "stream": _fake_stream,
                        "get_rng_state": lambda device=None: torch.get_rng_state(),
                        "set_rng_state": lambda state, device=None: torch.set_rng_state(state)}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    yield FakeGraph
    assert _current == [DEFAULT_STREAM], "a stream was left current"
