"""One command, one table: this project's training step, decoding and data preparation against plain
nanoGPT-style baselines, measured side by side in one process. The measuring lives in benchmarks/
(see its __init__ for the map); this script only starts the command: benchmarks/cli.py parses the
options, benchmarks/suite.py runs the sections and prints the report.

    python bench.py                                    # CPU: everything (~5 min on a quiet 2-core CPU)
    python bench.py --device cuda                      # GPU: GPT-2 124M rows, decode, same-loss check
    python bench.py --json benchmarks/results/results-cpu.json # also write the results as JSON
    python bench.py --only budget                      # quality in nanoGPT's time (minutes)
    python bench.py --only profile                     # where a CPU training step's time goes
    python bench.py --only fsdp                        # DDP vs FSDP: 2 gloo ranks, ~95M params, RSS and step time
    python bench.py --only serve                       # python serve.py under 1 and 8 streaming clients
    python bench.py --compile                          # add torch.compile rows on a CPU
    python bench.py --quick                            # smoke run: seconds, figures meaningless
    python bench.py --only train --only muon --isa-avx2  # also re-run them as on an AVX2-only CPU

Offline, point tiktoken and tiny shakespeare at local copies first:

    export TIKTOKEN_CACHE_DIR=../shared/tiktoken_cache SMALLGPT_SHAKESPEARE=../shared/data/tinyshakespeare/input.txt

Not a test: nothing asserts a speed. On a shared machine every figure is low; the ratios hold better.
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # before the heavy imports: Ctrl-C during start-up is one line
    errors.quiet_interrupts()

from benchmarks.cli import main  # noqa: E402

if __name__ == "__main__":
    errors.start_up_done()
    errors.run_cli(main)
