"""The evals' forwards replayed as CUDA graphs, beside the graphed training step (step.py).

An eval runs the model forward on eval_iters fixed batches of each split, and on a model whose training
step is bound by kernel launches each forward is too: on the H100, shakespeare_char_gpu.yaml's evals took
about 1 s each (80 forwards of 64 x 256 tokens, ~12 ms apiece for ~0.35 TFLOP), small.yaml's 0.3 s
(benchmarks/results/h100-2026-11-27/). Where the run plan graphs the training step, the run's loss
(LMLoss, the fused head + loss) is recorded once per batch shape in eval mode without gradients, and
replayed with one launch:

- the batch: static (x, y) buffers, the eval batch copied in before each replay;
- the weights: read where they are. The training step updates them in place, and a resume or the time
  budget's restore copies into them; what would replace them (load_state_dict with assign, another model)
  is noticed by their addresses, and the forward is recorded again;
- the loss: written by the graph into its own output, copied out before the next replay.

The first call of a shape runs eagerly (on a GPU on a side stream: lazy initialisations must not happen
inside a capture), then records; the second replays, checked against the eager forward on its batch (not
the recording's: a graph that replays nothing would still hold that one's loss). A capture that fails or a
replay that disagrees says so in one line, and the evals go on eagerly.
The capture runs with autocast's cache of cast weights off: the eager forward just before it, in the same
autocast context, has filled that cache with low-precision copies of the weights, and a capture that read
them would replay those copies (the weights of its recording, in memory freed when the context ends)
instead of casting the weights of each replay. The shapes' graphs share one memory pool, captured on one stream
(the allocator reuses a block only on the stream it was made on): they never run at once, and each output is
copied out before the next replay.

On a CPU (the tests) the same path runs uncaptured: the same static buffers and calls.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

from errors import short_error

from .step import on_side_stream


class _Shape:
    """One batch shape's buffers and graph."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = torch.empty_like(x), torch.empty_like(y)
        self.unchecked = True  # its first replay is checked against the eager forward
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None  # what the graph writes


class GraphedLoss:
    """loss(model, x, y) for the evals: with gradients off and the model in eval mode, replayed as a CUDA
    graph per batch shape where `capture`, else run uncaptured on the same static buffers; anything else
    (training mode, gradients on) is the plain loss."""

    def __init__(self, loss: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor], *,
                 capture: bool, say: Callable[[str], None]):
        self.loss, self.capture, self.say = loss, capture, say
        self.eager = False  # a capture failed or disagreed: eager forwards from here on
        self.shapes: dict[tuple, _Shape] = {}
        self.weights: tuple = ()  # what the records read: the model, its tensors' addresses, autocast
        self.pool = self.stream = None  # the memory pool the shapes' graphs share, the stream they are captured on

    def __call__(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.eager or model.training or torch.is_grad_enabled():
            return self.loss(model, x, y)
        weights = _weights(model, x.device)
        if weights != self.weights:  # new tensors (or another model): every record read the old ones
            self.shapes, self.weights, self.pool = {}, weights, None  # (a pool whose graphs are gone: a new one)
        key = (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype)
        shape = self.shapes.get(key)
        if shape is None:
            self.shapes[key] = shape = _Shape(x, y)
            return self._record(model, shape, x, y)
        if shape.unchecked:
            return self._checked(model, shape, x, y)
        return self._replay(model, shape, x, y)

    def _record(self, model, shape: _Shape, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The eager forward (on a GPU on a side stream, where lazy initialisations happen outside the capture
        that follows), then the forward recorded on the static buffers, to be checked on its next call."""
        if not self.capture:
            return self.loss(model, x, y)
        expected = on_side_stream(lambda: self.loss(model, x, y)).clone()
        try:
            shape.x.copy_(x)  # a capture runs nothing, but the buffers then hold real tokens all the same
            shape.y.copy_(y)
            graph = torch.cuda.CUDAGraph()
            # one pool, captured into on one stream of our own: the allocator reuses a block only on the stream it
            # was made on; and a capture that fails leaves torch.cuda.graph's stream current (this context puts the
            # run's back)
            if self.pool is None:
                self.pool, self.stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
            stream = self.stream
            with torch.cuda.stream(stream), torch.cuda.graph(graph, pool=self.pool, stream=stream), _casts_recorded(x):
                shape.out = self.loss(model, shape.x, shape.y)
        except Exception as e:  # a capture fails with whatever the op it refused raises; it ran nothing
            return self._go_eager(f"the capture failed ({short_error(e)})", expected)
        shape.graph = graph
        return expected

    def _checked(self, model, shape: _Shape, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The first replay, on another batch than the recording's, against the eager forward on it (one host
        sync, once per shape)."""
        expected = self.loss(model, x, y)
        try:
            got = self._replay(model, shape, x, y)
        except Exception as e:
            return self._go_eager(f"its replay failed ({short_error(e)})", expected)
        e, g = float(expected), float(got)
        if not abs(e - g) <= 1e-3 * abs(e) + 1e-6:
            return self._go_eager(f"a replay's loss {g:.6g} differs from the eager forward's {e:.6g}", expected)
        shape.unchecked = False
        return got

    def _replay(self, model, shape: _Shape, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shape.x.copy_(x)
        shape.y.copy_(y)
        if shape.graph is None:
            return self.loss(model, shape.x, shape.y)
        shape.graph.replay()
        return shape.out.clone()  # the next replay overwrites it

    def _go_eager(self, why: str, expected: torch.Tensor) -> torch.Tensor:
        self.say(f"the CUDA-graphed evals are off: {why}; continuing eagerly")
        self.eager, self.shapes, self.weights, self.pool = True, {}, (), None
        return expected


def _casts_recorded(x: torch.Tensor):
    """The caller's autocast (if any) with its cache of cast weights off: each cast is then recorded into the
    graph and redone by every replay, from the weights as they are then."""
    kind = x.device.type
    if not torch.is_autocast_enabled(kind):
        return contextlib.nullcontext()
    return torch.autocast(kind, dtype=torch.get_autocast_dtype(kind), cache_enabled=False)


def _weights(model: torch.nn.Module, device: torch.device) -> tuple:
    """What a recorded forward read besides its batch: the model, the addresses of its parameters and
    buffers (load_state_dict with assign, or a model built anew, makes new ones), and the autocast state."""
    kind = device.type
    return (id(model), tuple(t.data_ptr() for t in model.parameters()), tuple(t.data_ptr() for t in model.buffers()),
            torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))

