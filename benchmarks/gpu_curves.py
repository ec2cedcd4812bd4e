"""Val loss against wall time, ours and nanoGPT's, from the stamped logs of benchmarks/gpu_round.sh.

    python -m benchmarks.gpu_curves benchmarks/results/h100-2026-11-27 docs/gpu-curves.png
    python -m benchmarks.gpu_curves benchmarks/results/h100-2026-11-28 benchmarks/results/h100-2026-11-28b docs/gpu-curves.png

Each log line starts with the seconds since its command started (gpu_round.sh's `stamp`), so a val line's
stamp is the wall time to that loss, start-up and compile included, as a user waits for it. Every run of
RUNS whose log is in the folder is drawn (a round that ran only some steps draws those; a log with no val
line, a step cut before its first eval, is left out with a note), characters on the left against --target
(the loss axis from just under the target to the runs' second eval: the first, at step 0, is ~4.2), GPT-2
BPE on the right; the card is summary.txt's. A folder with none of them is one line saying so. Several folders
(rounds of several calls or sessions): each run's log from the last folder that holds it, labelled with its folder.
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # a command: Ctrl-C while the imports below run is one line (errors.quiet_interrupts)
    errors.quiet_interrupts()

import argparse
import re
import sys
from pathlib import Path

from errors import UserError, run_cli
from eval.drawing import MAX_DRAWN, check_format, literal_legend, new_figure, save_figure
from fileio import atomic_write, file_arg, read_user_file
from ownership import check_output

OURS = re.compile(r"^\s*([\d.]+) iter (\d+): train loss [\d.]+, val loss ([\d.]+)")
NANOGPT = re.compile(r"^\s*([\d.]+) step (\d+): train loss [\d.]+, val loss ([\d.]+)")
# (gpu_round.sh step's log, its pattern, the label, the panel: characters or BPE)
RUNS = (("nanogpt_char.log", NANOGPT, "nanoGPT: train_shakespeare_char.py", "char"),
        ("ours_char.log", OURS, "ours: shakespeare_char_gpu.yaml (compiled)", "char"),
        ("ours_char_graph.log", OURS, "ours: shakespeare_char_gpu.yaml, CUDA graph, no compile", "char"),
        ("ours_char_1000.log", OURS, "ours: shakespeare_char_gpu.yaml, 1000 steps (shipped since)", "char"),
        ("ours_char_adamw.log", OURS, "ours: shakespeare_char_gpu.yaml with AdamW", "char"),
        ("ours_bpe.log", OURS, "ours: shakespeare_gpu.yaml (GPT-2 BPE), CUDA graph", "bpe"),
        ("ours_bpe_compiled.log", OURS, "ours: shakespeare_gpu.yaml (GPT-2 BPE), compiled", "bpe"),
        ("nanogpt_bpe.log", NANOGPT, "nanoGPT: its baby-GPT recipe on GPT-2 BPE", "bpe"))
MAX_LOG = 64 * 2**20  # a round's log is a few hundred KB


def val_curve(path: Path, pattern: re.Pattern) -> list[tuple[float, int, float]]:
    """(seconds, step, val loss) of every eval line of a stamped log; a line whose numbers no axis spans (past
    eval/drawing.py's MAX_DRAWN: 400 digits read as inf) left out, with a note."""
    text = read_user_file(path, "the log", fix="run the round's step first", limit=MAX_LOG)
    out, beyond = [], []
    for number, line in enumerate(text.decode("utf-8", errors="replace").split("\n"), 1):  # a bar's \r frames in one
        m = pattern.match(line.rsplit("\r", 1)[-1]) or pattern.match(line)
        if m:
            point = (float(m.group(1)), int(m.group(2)), float(m.group(3)))
            if all(abs(v) <= MAX_DRAWN for v in point):
                out.append(point)
            else:
                beyond.append(number)
    if beyond:
        more = f" (and {len(beyond) - 1} more line(s) like it)" if len(beyond) > 1 else ""
        print(f"note: {path} line {beyond[0]}: a number beyond {MAX_DRAWN:g} either way, more than a plot's axis "
              f"spans; left out{more}", file=sys.stderr)
    return out


def first_below(curve, loss: float):
    return next(((s, step, v) for s, step, v in curve if v <= loss), None)


def curves(folders: list[Path]) -> list[tuple[str, str, list]]:
    """(label, panel, curve) of each run whose log a folder holds, in RUNS' order: the last folder's that holds it,
    named in the label where there are several folders."""
    for folder in folders:
        if not folder.is_dir():
            raise UserError(f"{folder} is not a folder; name the folder of a round's logs (gpu_round.sh's $OUT/logs)")
    found = []
    for name, pattern, label, panel in RUNS:
        folder = next((f for f in reversed(folders) if (f / name).exists()), None)
        if folder is None:
            continue
        curve = val_curve(folder / name, pattern)
        if not curve:
            print(f"note: {folder / name} holds no val loss line (the step was cut before its first eval?): "
                  "left out", file=sys.stderr)
            continue
        found.append((f"{label} ({folder.name})" if len(folders) > 1 else label, panel, curve))
    if not found:
        where = f"{folders[0]} holds" if len(folders) == 1 else f"{', '.join(map(str, folders))} hold"
        raise UserError(f"{where} none of the round's training logs with a val loss line "
                        f"({', '.join(r[0] for r in RUNS)}); name the folder of a round's logs")
    return found


def card(folder: Path) -> str:
    """The GPU the round ran on: summary.txt's first line (`######## <time> <name>, <memory>, <driver>`)."""
    summary = folder / "summary.txt"
    if summary.is_file():
        first = read_user_file(summary, "the summary", fix="", limit=MAX_LOG).decode("utf-8", "replace")
        m = re.search(r"^#+ \S+ ([^,\n]+)", first, re.M)  # (after any "== wheels" line)
        if m:
            return m.group(1).strip()
    return "one GPU"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("logs", type=Path, nargs="+", help="the folder(s) of a round's logs")
    p.add_argument("out", type=file_arg)
    p.add_argument("--target", type=float, default=1.47, help="the characters' val loss to reach (nanoGPT's best)")
    args = p.parse_args(argv)
    out = check_output(args.out, "out")  # the gate (ownership.py): a picture, never into a managed folder
    if out.is_dir():
        raise UserError(f"out {out} is a folder; name the picture's file, e.g. {out / 'gpu-curves.png'}")
    fmt = check_format(out.suffix or ".png", "out", out)  # (no suffix: a PNG, as before)
    found = curves(args.logs)
    panels = [panel for panel in ("char", "bpe") if any(f[1] == panel for f in found)]
    fig = new_figure((7 * len(panels), 5))  # (its one line where matplotlib is missing)
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for label, _, curve in (f for f in found if f[1] == panel):
            best = min(curve, key=lambda point: point[2])
            line = f"{label}: best {best[2]:.4f} at step {best[1]}, {best[0]:.1f} s"
            if panel == "char":
                hit = first_below(curve, args.target)
                line += (f"; val {hit[2]:.4f} <= {args.target} at step {hit[1]}, {hit[0]:.1f} s" if hit
                         else f"; never <= {args.target}")
            print(line)
            ax.plot([s for s, _, _ in curve], [v for _, _, v in curve], marker="o", ms=3, label=label)
        runs = list(ax.lines)  # (the target's line, drawn next, is no run: not in the legend)
        if panel == "char":  # the band where the runs are compared: the first eval (step 0, ~4.2) flattens it
            ax.axhline(args.target, color="grey", lw=0.8, ls="--")
            second = max(c[1][2] if len(c) > 1 else c[0][2] for _, p, c in found if p == "char")
            ax.set_ylim(args.target - 0.07, max(second, args.target + 0.1))
        else:  # the same for BPE: nanoGPT's step-0 eval (~10.9) would flatten the rest
            runs_here = [c for _, p, c in found if p == panel]
            later = [v for c in runs_here for _, _, v in c[1:]] or [c[0][2] for c in runs_here]
            ax.set_ylim(min(v for c in runs_here for _, _, v in c) - 0.1, max(later) + 0.1)
        ax.set(xlabel="wall time since the command started, s (start-up and compile included)", ylabel="val loss",
               title=f"tiny shakespeare, {'characters' if panel == 'char' else 'GPT-2 BPE'}, "
                     f"{' / '.join(dict.fromkeys(card(f) for f in args.logs))}")
        literal_legend(ax, runs, [line.get_label() for line in runs], framealpha=1.0,  # (PostScript has no alpha)
                       loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize="small")  # below: no curve hidden
    fig.tight_layout()
    with atomic_write(out, "out", follow=True) as tmp:  # as training.plot writes its picture
        save_figure(fig, tmp, fmt, dpi=110, name=out)
    return 0


if __name__ == "__main__":
    errors.start_up_done()  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    run_cli(main)
