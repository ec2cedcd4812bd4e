"""Val loss against wall time, ours and nanoGPT's, from the stamped logs of benchmarks/gpu_round.sh.

    python -m benchmarks.gpu_curves benchmarks/results/h100-2026-11-27 docs/gpu-curves.png

Each log line starts with the seconds since its command started (gpu_round.sh's `stamp`), so a val line's
stamp is the wall time to that loss, start-up and compile included, as a user waits for it.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from errors import run_cli
from fileio import path_arg
from ownership import check_output

OURS = re.compile(r"^\s*([\d.]+) iter (\d+): train loss [\d.]+, val loss ([\d.]+)")
NANOGPT = re.compile(r"^\s*([\d.]+) step (\d+): train loss [\d.]+, val loss ([\d.]+)")
RUNS = (("ours_char.log", OURS, "ours: shakespeare_char_gpu.yaml"),
        ("nanogpt_char.log", NANOGPT, "nanoGPT: train_shakespeare_char.py"))


def val_curve(path: Path, pattern: re.Pattern) -> list[tuple[float, int, float]]:
    """(seconds, step, val loss) of every eval line of a stamped log."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = pattern.match(line)
        if m:
            out.append((float(m.group(1)), int(m.group(2)), float(m.group(3))))
    return out


def first_below(curve, loss: float):
    return next(((s, step, v) for s, step, v in curve if v <= loss), None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("logs", type=Path)
    p.add_argument("out", type=path_arg)
    p.add_argument("--target", type=float, default=1.47)
    args = p.parse_args(argv)
    out = check_output(args.out, "out")  # the gate (ownership.py): a picture, never into a managed folder
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, pattern, label in RUNS:
        curve = val_curve(args.logs / name, pattern)
        hit = first_below(curve, args.target)
        print(f"{label}: " + (f"val {hit[2]:.4f} <= {args.target} at step {hit[1]}, {hit[0]:.1f} s" if hit
                              else f"never <= {args.target}") + f"; best {min(v for _, _, v in curve):.4f}")
        ax.plot([s for s, _, _ in curve], [v for _, _, v in curve], marker="o", ms=3, label=label)
    ax.axhline(args.target, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="wall time since the command started, s (start-up and compile included)", ylabel="val loss",
           ylim=(1.4, 2.2), title="tiny shakespeare, characters, one H100")
    ax.legend()
    fig.tight_layout()
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    run_cli(main)
