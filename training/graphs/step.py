"""The training step replayed as one CUDA graph, for a model whose step is bound by kernel launches.

small.yaml's 4 x 128 model takes 13.9 ms a step on one H100, of which the GPU is busy 2.1 ms: 324
kernels, each costing more to launch from Python than to run (benchmarks/results/h100-2026-11-27/
small_profile.log). A CUDA graph records the step's kernels once and replays them with one launch. A
graph replays fixed memory addresses, so everything the step reads and writes stays where it is:

- the micro-batches: static (x, y) buffers, this step's tokens copied in before each replay;
- the learning rate: one device tensor per param group, filled before each replay and read by the
  optimizers inside the recorded step (fused AdamW takes a tensor rate; Muon multiplies by it);
- the parameters and the optimizer state, updated in place by the step. What replaces them (a resume, or
  the time budget putting its timed steps back, with load_state_dict) is noticed by their addresses before
  the next step, and the step is recorded again; an optimizer put back to no state at all first makes it
  in an eager step.

What is recorded is train_step itself (training/step.py) on those buffers. The first WARMUP_STEPS steps
of a process run eagerly (on a GPU on a side stream, as torch's make_graphed_callables warms up): they
make the optimizer state and the lazy initialisations that must not happen inside a capture. The first
two replays are each checked against the eager step from the same state (the same tokens, rate and dropout
offsets, so the same kernels on the same inputs: the second is the first whose rate and offsets differ from
the recording's); where they differ, or the capture fails, the run says so in one line and goes on eagerly.

On a CPU (the tests) the same static step runs uncaptured: the same buffers, tensor rates and calls, so
its equality with the eager train_step is checked without a GPU.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import torch

from errors import short_error

from ..step import StepOutput

WARMUP_STEPS = 3  # eager steps before the capture (torch's whole-network capture example warms up 3)
CHECKED_REPLAYS = 2  # the first replays after a record, each checked against the eager step: the second is
#                      the first whose rate and dropout offsets differ from the recording's
Batches = Sequence[tuple[torch.Tensor, torch.Tensor]]
T = TypeVar("T")


class GraphedStep:
    """step(batches) as train_step runs it, replayed as one CUDA graph where `capture`, else run
    uncaptured on the same static buffers. `step` is train_step bound to the run's model, loss,
    optimizers and scaler; `optimizers` and `model` are what it updates in place.

    Every step of such a run, the eager ones too (the warm-up, the check, a fallback), reads its learning
    rates from the same device tensors, so which steps were replayed never changes a bit: a run resumed
    in another process (whose warm-up falls on other steps) trains as the uninterrupted one."""

    def __init__(self, step: Callable[[Batches], StepOutput], optimizers: Sequence[torch.optim.Optimizer],
                 model: torch.nn.Module, *, capture: bool, say: Callable[[str], None]):
        self.step, self.optimizers, self.model, self.capture, self.say = step, optimizers, model, capture, say
        device = next(model.parameters()).device
        self.rates = [torch.zeros((), dtype=_rate_dtype(opt, device), device=device)
                      for opt in optimizers for _ in opt.param_groups]
        self.warmed = 0
        self.eager = False  # the capture failed or disagreed: the eager step from here on
        self.static: list[tuple[torch.Tensor, torch.Tensor]] = []  # the batches the graph reads
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: StepOutput | None = None  # what the graph writes
        self.recorded: tuple = ()  # what the graph was recorded for (_recorded_for): another one records again
        self.checks_left = 0  # replays still to check against the eager step (_checked)

    @property
    def groups(self) -> list[dict]:
        """The param groups as the optimizers hold them now: load_state_dict (a resume, the time budget's
        restore) puts in new dicts."""
        return [g for opt in self.optimizers for g in opt.param_groups]

    def __call__(self, batches: Batches) -> StepOutput:
        if self.eager:
            return self._eager(batches)
        if self.warmed < WARMUP_STEPS or not self._state_made():
            # an optimizer without its state (before the first step; the time budget puts back the empty state
            # it started from) makes it in a step: no record may snapshot, nor a graph write, a state not yet
            # made; a graph recorded before is let go first (its memory pool is a whole step's)
            self.graph = self.out = None
            self.recorded = ()
            self.warmed += 1
            if not self.capture:
                return self._eager(batches)
            out = on_side_stream(lambda: self._eager(batches))
            return StepOutput(out.loss.clone(), out.grad_norm.clone())  # on the current stream: the loop keeps them
        if self._recorded_for(batches) != self.recorded:
            failed = self._record(batches)
            if failed is not None:
                return failed
        if self.checks_left:
            return self._checked(batches)
        return self._replay(batches)

    def _recorded_for(self, batches: Batches) -> tuple:
        """What a graph replays as it was when recorded: the addresses of every tensor it updates in place
        (load_state_dict makes new ones), the param groups it read its rates through, the batches' shapes,
        and train / eval mode (dropout)."""
        return (self._state_addresses(), tuple(id(g) for g in self.groups), self._shapes(batches),
                self.model.training)

    def _state_made(self) -> bool:
        """Whether every optimizer has made its state (its first step does; a parameter that never gets a
        gradient never gets state, so the test is per optimizer)."""
        return all(len(opt.state) > 0 for opt in self.optimizers)

    # ----------------------------------------------------------------------------------- the step
    def _rated(self, batches: Batches) -> StepOutput:
        """train_step on `batches`, each param group's rate read from its tensor (filled beforehand)."""
        groups = self.groups
        saved = [(g["lr"], g.get("capturable")) for g in groups]
        for rate, group in zip(self.rates, groups):
            group["lr"] = rate
            if "capturable" in group:  # torch's optimizers refuse a capture unless told it is one
                group["capturable"] = True
        try:
            return self.step(batches)
        finally:  # the floats back: the schedule, the log and the checkpoint see what they always saw
            for (lr, capturable), group in zip(saved, groups):
                group["lr"] = lr
                if capturable is not None:
                    group["capturable"] = capturable

    def _fill_rates(self) -> None:
        """The schedule's rates (set as floats on the groups) into the tensors the step reads: outside any
        graph, since they change every step."""
        groups = self.groups
        assert len(groups) == len(self.rates), "a param group was added: its rate would be read as a float"
        for rate, group in zip(self.rates, groups):
            rate.fill_(group["lr"])

    def _eager(self, batches: Batches) -> StepOutput:
        self._fill_rates()
        return self._rated(batches)

    def _copy_in(self, batches: Batches) -> None:
        for (sx, sy), (x, y) in zip(self.static, batches):  # this step's tokens where the graph reads them
            sx.copy_(x)
            sy.copy_(y)

    def _replay(self, batches: Batches) -> StepOutput:
        self._copy_in(batches)
        self._fill_rates()
        if self.graph is None:
            out = self._rated(self.static)
        else:
            self.graph.replay()
            out = self.out
        # copies: the graph overwrites its outputs on the next replay, and the loop keeps these
        return StepOutput(out.loss.clone(), out.grad_norm.clone())

    # ------------------------------------------------------------------------------- recording
    def _record(self, batches: Batches) -> StepOutput | None:
        """(Re)make the buffers and, on a GPU, record the step into a graph, to be checked on its next
        CHECKED_REPLAYS replays. None, or where the capture failed this step's output, eagerly."""
        self.graph = self.out = None
        self.static = [(torch.empty_like(x), torch.empty_like(y)) for x, y in batches]
        self.recorded = self._recorded_for(batches)
        if not self.capture:
            return None
        try:
            self._copy_in(batches)  # a capture runs nothing, but the buffers then hold real tokens all the same
            self._fill_rates()
            graph = torch.cuda.CUDAGraph()
            # in a stream of our own: a capture that fails leaves torch.cuda.graph's stream current (its exit
            # ends the capture before it leaves the stream), and this context puts the run's stream back
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
                self.out = self._rated(self.static)
        except Exception as e:  # a capture fails with whatever the op it refused raises; it ran nothing
            self.out = graph = None
            return self._go_eager(None, batches, f"the capture failed ({short_error(e)})")
        self.graph, self.checks_left = graph, CHECKED_REPLAYS
        return None

    def _checked(self, batches: Batches) -> StepOutput:
        """A replay checked against the eager step from the same state (the state's copy in host memory,
        put back in place before the replay): on the first replays, where a number baked into the graph
        (a rate, a dropout offset) would first show."""
        try:  # in host memory: the device's is the step's, and the graph's pool
            before = self._snapshot()
        except RuntimeError as e:
            return self._go_eager(None, batches, f"no memory for the state's copy ({short_error(e)})")
        expected = self._eager(batches)  # its own output tensors: no replay writes them
        if len(self._state()) != len(before[0]):  # the step made state for a parameter that had none: its
            self.recorded = ()                     # output stands, and the next step records again
            return expected
        params = list(self.model.parameters())
        after = [p.detach().to("cpu", copy=True) for p in params]
        self._restore(before)
        try:
            got = self._replay(batches)
        except Exception as e:
            return self._go_eager(before, batches, f"its replay failed ({short_error(e)})")
        problem = _disagreement(expected, got, before[0][:len(params)], after, [p.detach().cpu() for p in params])
        if problem:
            return self._go_eager(before, batches, problem)
        self.checks_left -= 1
        return got

    def _go_eager(self, before, batches: Batches, why: str) -> StepOutput:
        self.say(f"the CUDA-graphed training step is off: {why}; continuing eagerly")
        self.graph = self.out = None
        self.eager = True
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        if before is not None:
            self._restore(before)
        return self._eager(batches)

    def _state(self) -> list[torch.Tensor]:
        """Every tensor a step updates in place: the parameters, then the optimizers' state."""
        state = [v for opt in self.optimizers for st in opt.state.values() for v in st.values()
                 if isinstance(v, torch.Tensor)]
        return [p.detach() for p in self.model.parameters()] + state

    def _state_addresses(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for t in self._state())

    def _snapshot(self):
        """(every state tensor's value, the parameters first, in host memory; the RNG streams) to put back
        in place."""
        device = self.rates[0].device
        return ([t.to("cpu", copy=True) for t in self._state()], torch.cuda.get_rng_state(device),
                torch.get_rng_state())

    def _restore(self, snapshot) -> None:
        values, cuda_rng, cpu_rng = snapshot
        state = self._state()
        assert len(state) == len(values), "the state changed shape between its copy and its restore"
        with torch.no_grad():
            for t, v in reversed(list(zip(state, values))):  # reversed: a view restored before what it views
                t.copy_(v)
        torch.cuda.set_rng_state(cuda_rng, self.rates[0].device)
        torch.set_rng_state(cpu_rng)

    @staticmethod
    def _shapes(batches) -> tuple:
        return tuple((tuple(x.shape), tuple(y.shape)) for x, y in batches)


def _rate_dtype(opt: torch.optim.Optimizer, device: torch.device) -> torch.dtype:
    """The width a learning rate is read in, as a tensor, where it is read as it is as a float. CUDA's fused
    Adam(W) kernel reads a tensor rate through a float pointer: fp32 (a float rate stays a double there, so
    a graphed run's AdamW steps differ from a plain run's in the last bits). The CPU kernel reads a tensor
    rate as a double, and Muon multiplies by it as by a float: fp64, the same bits as the float rate."""
    adam = isinstance(opt, (torch.optim.Adam, torch.optim.AdamW))
    return torch.float32 if adam and device.type == "cuda" else torch.float64


def on_side_stream(fn: Callable[[], T]) -> T:
    """fn() on a side stream, ordered after and before the current one (as torch's make_graphed_callables
    warms up): lazy initialisations happen there, not in the capture that follows. What it returns is the side
    stream's: copy what is kept on the current stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fn()
    torch.cuda.current_stream().wait_stream(side)
    return out


def _disagreement(expected: StepOutput, got: StepOutput, before: list[torch.Tensor], after: list[torch.Tensor],
                  params: list[torch.Tensor]) -> str:
    """'' where a replay agrees with the eager step from the same state: the same loss and gradient norm (to
    1e-3: attention's backward may add in another order), and each parameter's update the same to within a
    tenth of its size (host syncs, on the checked replays only)."""
    for name, e, g in (("loss", expected.loss, got.loss), ("gradient norm", expected.grad_norm, got.grad_norm)):
        e, g = float(e), float(g)
        if not abs(e - g) <= 1e-3 * abs(e) + 1e-6:
            return f"a replay's {name} {g:.6g} differs from the eager step's {e:.6g}"
    for b, a, p in zip(before, after, params):
        if float((p.detach() - a).abs().max()) > 0.1 * float((a - b).abs().max()) + 1e-12:
            return "a replay's update differs from the eager step's"
    return ""
