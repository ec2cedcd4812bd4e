"""`python train.py`: the config parsed (training/config/: the YAML and the `--section.key=value` overrides,
each checked) and the run trained (training/loop.py's `train`)."""
from __future__ import annotations

import sys

from training.config.sections import load_config
from training.loop import train
from training.report.metrics import console_guard


def main(argv: list[str] | None = None) -> int:
    cfg = load_config(sys.argv[1:] if argv is None else argv)
    with console_guard():  # a closed or full stdout never stops a run
        train(cfg)
    return 0
