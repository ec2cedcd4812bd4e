"""Curves without wandb: train and val loss against step and against tokens seen, and the learning rate,
read from the metrics.jsonl of one or more runs, in one PNG.

    python -m training.plot out/small                       # -> out/small/curves.png
    python -m training.plot out/small out/small_modern --out compare.png

matplotlib is optional: it is imported here only, and its absence is a one-line hint.
"""
from __future__ import annotations

import json
from pathlib import Path

from errors import ArgumentParser, UserError, run_cli, short_error
from fileio import atomic_write, remove_stale_temps

from .metrics import METRICS_NAME


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of `run_dir`/metrics.jsonl (or the file itself); a torn last line is skipped."""
    path = run_dir / METRICS_NAME if run_dir.is_dir() else run_dir
    if not path.is_file():
        raise UserError(f"no {METRICS_NAME} in {run_dir}; pass a training out_dir (train.out_dir) or the file itself")
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path} ({short_error(e)}); check the file") from None
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                continue  # the last line of a run killed mid-write
            raise UserError(f"{path} line {number} is not JSON; fix or remove that line") from None
        if isinstance(record, dict) and isinstance(record.get("iter"), int):
            records.append(record)
    if not any("train/loss" in r or "val/loss" in r for r in records):
        raise UserError(f"{path} has no train or val loss yet; plot again once the run has logged a step")
    return records


def series(records: list[dict], key: str, x: str) -> tuple[list, list]:
    points = [(r[x], r[key]) for r in records if r.get(key) is not None and r.get(x) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UserError("plotting needs matplotlib, which is not installed; pip install matplotlib") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def make_figure(run_dirs: list[Path]):
    """One figure, three panels: loss against step, loss against tokens seen (train solid, val dashed),
    and the learning rate against step; one colour per run."""
    plt = _pyplot()
    runs = {str(d): read_metrics(d) for d in run_dirs}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for color, (name, records) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 10, runs.items()):
        for ax, x in ((axes[0], "iter"), (axes[1], "tokens_seen")):
            ax.plot(*series(records, "train/loss", x), color=color, label=f"{name} train")
            ax.plot(*series(records, "val/loss", x), color=color, linestyle="--", marker="o", markersize=3,
                    label=f"{name} val")
        axes[2].plot(*series(records, "lr", "iter"), color=color, label=name)
    for ax, xlabel, ylabel in ((axes[0], "step", "loss"), (axes[1], "tokens seen", "loss"), (axes[2], "step", "learning rate")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot(run_dirs: list[Path], out: Path) -> Path:
    fig = make_figure(run_dirs)  # every input is checked before anything is written
    plt = _pyplot()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # `--out docs/curves.png` in a fresh clone
        remove_stale_temps(out.parent, name=out.name)  # what a plot killed mid-write left
        with atomic_write(out) as tmp:  # a failure (a full disk) leaves the old PNG, not a torn one
            fig.savefig(tmp, dpi=110, format=out.suffix.lstrip(".").lower() or "png")
    except OSError as e:
        raise UserError(f"cannot write {out} ({short_error(e)}); choose another --out") from None
    finally:
        plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m training.plot", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="training out_dirs (or metrics.jsonl files)")
    p.add_argument("--out", type=Path, default=None, help="the PNG to write (default: <first run>/curves.png)")
    args = p.parse_args(argv)
    out = args.out or (args.runs[0] / "curves.png" if args.runs[0].is_dir() else args.runs[0].with_suffix(".png"))
    print(plot(args.runs, out))
    return 0


if __name__ == "__main__":
    run_cli(main)
