"""Train a GPT.

    python train.py --config small.yaml [--section.key=value ...]
    torchrun --standalone --nproc_per_node=N train.py --config ...       # data parallel (nccl / gloo)
    torchrun ... train.py --config ... --train.parallel=fsdp           # sharded: weights, grads, optimizer

The command is training/cli.py's `main` (the config parsed, then the run trained); the run reads top to
bottom in training/: `loop.py`'s `train` builds it by `chain.py`'s `set_up`, one chain of builders (the out_dir
and the resume decision, the data, the model, its training step, the checkpointed states, logging), settling
every start-up decision into the run plan (training/plan.py) on the way; `loop` runs one step per iteration
and then whatever is due (log, eval, checkpoint, stop); `train` tears everything down. Hardware switches
(precision, compile, DDP or FSDP) are applied from outside the model, one line each, and which ranks take
part in what is the parallel context's answer (training/parallel/distributed.py). `<out_dir>/ckpt.pt` is
always the latest complete checkpoint, `best.pt` the best val loss (ckpt.dcp/ and best.dcp/, sharded, with
train.parallel=fsdp), `metrics.jsonl` every logged step (rank 0).
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # before the heavy imports below: Ctrl-C during start-up is one line too
    errors.quiet_interrupts()

from training.cli import main  # noqa: E402

if __name__ == "__main__":  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    errors.start_up_done()
    errors.run_cli(main, oom_fix="lower train.batch_size (more train.grad_accum_steps keep the global batch), "
                                 "model.block_size or the model's size")
