"""Stop a diverged run before it logs, evaluates or saves poisoned weights."""
from __future__ import annotations

from pathlib import Path

import torch

from checkpoint import no_resume_advice
from errors import UserError

from .parallel.distributed import Parallel
from .report.metrics import METRICS_NAME
from .step import StepOutput


class NonFiniteGuard:
    """Remembers on the device (no host sync per step) whether any step's loss or grad norm was
    non-finite, and the first such step. With a GradScaler (fp16) an inf grad norm is normal: that
    step was skipped and the scale lowered, so only the loss counts."""

    def __init__(self, device: torch.device, *, fp16: bool):
        self.fp16 = fp16
        self.bad = torch.zeros((), dtype=torch.bool, device=device)
        self.first = torch.full((), -1, dtype=torch.long, device=device)

    def observe(self, out: StepOutput, iter_num: int) -> None:
        ok = torch.isfinite(out.loss) if self.fp16 else torch.isfinite(out.loss) & torch.isfinite(out.grad_norm)
        self.first = torch.where(~ok & (self.first < 0), iter_num, self.first)
        self.bad |= ~ok

    def check(self, par: Parallel, ckpt_path: Path, last_saved: int | None) -> None:
        """Raise the one-line error on every rank if any rank has seen a non-finite step."""
        if par.any(bool(self.bad.item())):
            fix = "lower train.lr (or train.weight_decay), raise train.warmup_iters or use bfloat16/float32"
            if last_saved is not None:
                where = f"{ckpt_path} still holds iter {last_saved}; {fix}, then rerun"
            else:  # nothing to resume, and the log it left would make the same out_dir refuse a fresh run
                where = (f"no checkpoint was written, so there is nothing to resume; {fix}, then "
                         + no_resume_advice(ckpt_path.parent, (METRICS_NAME,)))
            raise UserError(f"loss or grad norm became non-finite at iter {int(self.first.item())}; stopped, {where}")
