"""When things happen: the learning rate of each step (linear warmup, then cosine decay to min_lr), and
what is due after each step (log, eval, checkpoint, HellaSwag, samples, the attention maps)."""
from __future__ import annotations

import math
from dataclasses import dataclass


def lr_at(step: int, *, lr: float, min_lr: float, warmup_iters: int, max_iters: int) -> float:
    """Learning rate for optimizer step `step` (0-based).

    - warmup, step < warmup_iters: lr * (step + 1) / warmup_iters, so step warmup_iters - 1 runs at lr
      (nanoGPT's get_lr ramps lr * (it + 1) / (warmup_iters + 1) and reaches lr one step later: ours is
      (warmup_iters + 1) / warmup_iters of it in the warmup, the same from warmup_iters on;
      tests/test_against_nanogpt.py);
    - then cosine from lr at step warmup_iters down to min_lr at step max_iters (one past the last
      step that runs): min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2,
      progress = (step - warmup_iters) / (max_iters - warmup_iters);
    - min_lr from max_iters on.
    """
    if step < warmup_iters:
        return lr * (step + 1) / warmup_iters
    if step >= max_iters:
        return min_lr
    progress = (step - warmup_iters) / (max_iters - warmup_iters)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def apply_lr(optimizers, lr: float, peak_lr: float) -> None:
    """Set every param group to its own peak ("initial_lr", see training/optim.py) scaled by
    lr / peak_lr, so groups with different peaks follow the same warmup and decay."""
    scale = lr / peak_lr if peak_lr > 0 else 0.0
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * scale


@dataclass
class Due:
    """What the loop does after a step, besides stepping."""
    log: bool
    eval: bool
    checkpoint: bool
    hellaswag: bool = False
    sample: bool = False  # eval.sample_interval: text from the fixed prompts (training/report/showcase.py)
    inspect: bool = False  # eval.inspect_interval: the attention maps and surprisal of the fixed val snippet


@dataclass(frozen=True)
class Cadence:
    """Every how many steps each thing is due (0: off; checkpoint 0: at each eval), built once per run."""
    max_iters: int
    log: int
    eval: int
    checkpoint: int = 0
    hellaswag: int = 0
    sample: int = 0
    inspect: int = 0

    def after(self, step: int, stopping: bool) -> Due:
        """After optimizer step number `step` (1-based: `step` steps are done). The last step always logs
        and checkpoints, and evaluates (HellaSwag, samples and the attention maps too, each when it is on), and a
        step that evaluates, samples or draws also logs. So a run of n steps samples ceil(n / sample) times, as
        the time budget counts. A stop checkpoints and logs nothing of its own: the log window so far is saved
        with the checkpoint (training/report/window.py), so the resumed run logs the steps an uninterrupted one
        would. Every rank computes the same answer, since `stopping` is agreed between ranks."""
        last = step == self.max_iters
        eval_now = step % self.eval == 0 or last
        checkpoint = step % (self.checkpoint or self.eval) == 0 or last or stopping
        hellaswag, sample, inspect = (n > 0 and (step % n == 0 or last) for n in (self.hellaswag, self.sample,
                                                                                 self.inspect))
        # whatever runs the model logs too: the loop checks for non-finite weights before it logs
        log = step % self.log == 0 or last or eval_now or hellaswag or sample or inspect
        return Due(log=log, eval=eval_now, checkpoint=checkpoint, hellaswag=hellaswag, sample=sample, inspect=inspect)
