"""Curves without wandb: train and val loss against step and against tokens seen, val bits per byte, and
the learning rate, read from the metrics.jsonl of one or more runs, in one PNG (four titled panels).

    python -m training.plot out/small                       # -> out/small/curves.png
    python -m training.plot out/small out/small_modern --out compare.png --log-scale

--out: a file whose suffix matplotlib writes with nothing outside Python (.png, .pdf, .svg, ...; not .pgf); a
folder, or a name ending in / (made when missing), gets curves.png inside it and a name without a suffix gets .png
(`c` and `c.`: c.png); the path written is printed.
--log-scale: logarithmic loss and bits-per-byte axes (where late progress shows). matplotlib is a runtime
requirement (requirements.txt); imported only to draw (eval/drawing.py), so a partial install still trains, and its
absence here is a one-line hint.
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # a command: Ctrl-C while the imports below run is one line (errors.quiet_interrupts)
    errors.quiet_interrupts()

import io
import math
import os
import stat
import sys
from array import array
from pathlib import Path
from typing import Iterator

from bounded import TooLarge, opened
from errors import ArgumentParser, UserError, clipped, reader_left, run_cli, short_error
from eval.drawing import (MAX_DRAWN, check_format, drawable, literal_legend, matplotlib_agg, new_figure,
                          save_figure)
from fileio import (atomic_write, atomic_write_bytes, check_output_not_input, json_loads, no_empty_dirs_left,
                    output_target, path_arg, path_arg_path, path_kind, read_user_file, too_large)
from locks import remove_stale_temps
from ownership import check_output, check_replaceable, record_written
from settings import finite_number  # a value a curve can take (a string would be drawn as a category)

from .report.metrics import MAX_METRICS_BYTES, METRICS_NAME, Damaged, metrics_lines


def metrics_file(run: Path) -> Path:
    """The metrics.jsonl a run argument names: <out_dir>/metrics.jsonl, or the file itself."""
    return run / METRICS_NAME if run.is_dir() else run


# the keys the figure plots: x axes first (a record without a usable "iter" is not plotted at all)
X_KEYS = ("iter", "tokens_seen")
Y_KEYS = ("train/loss", "val/loss", "val/bpb", "lr")


KEYS = (*X_KEYS, *Y_KEYS)  # the order of a step's numbers, as read_metrics keeps them
NAN = float("nan")  # a number not logged (or not a number) at a step: every plotted value is finite


def fault(key: str, value) -> str | None:
    """Why `value` of `key` cannot be plotted, or None: a step is a whole number (2.0 is no step the trainer logs),
    any other key a number or null (the trainer's "not logged"), and no value beyond MAX_DRAWN either way."""
    if key != "iter" and value is None:
        return None
    if key == "iter" and not (isinstance(value, int) and finite_number(value)):
        return "not a whole number"
    if not finite_number(value):
        return "not a number"
    return f"beyond {MAX_DRAWN:g} either way, more than a plot's axis spans" if abs(value) > MAX_DRAWN else None


def _lines(path: Path) -> Iterator[tuple[int, str | Damaged]]:
    """The metrics file's lines, numbered, one at a time (metrics_lines, as a resume reads them: a Damaged for one
    over MAX_METRICS_LINE or not UTF-8; a BOM is no data), at most MAX_METRICS_BYTES in all, so that memory holds the
    numbers kept, never the file: a 1 GiB file read whole, split and parsed took 7.4 GB. Its refusals are
    read_user_file's lines."""
    what, fix = "metrics file", "pass a training out_dir (train.out_dir) or its metrics.jsonl"
    try:
        f = opened(path)
    except OSError:  # read_user_file says why in one line (missing, a socket, a loop, a permission), reading nothing
        read_user_file(path, what, fix=fix, limit=0)
        raise
    with f:
        mode = os.fstat(f.fileno()).st_mode
        if stat.S_ISDIR(mode):
            raise UserError(f"{what} {path} is {path_kind(path)}; pass a file")
        if not stat.S_ISREG(mode):  # a FIFO or a device: no run wrote it (a FIFO nobody writes read as no loss yet)
            raise UserError(f"{what} {path} is {path_kind(path)}, not a regular file; {fix}")
        try:
            yield from metrics_lines(f, bom=True)
        except TooLarge as e:
            raise too_large(what, path, MAX_METRICS_BYTES, e) from None


def read_metrics(run_dir: Path) -> dict[str, array]:
    """The step records of `run_dir`/metrics.jsonl (or the file itself), read a line at a time, kept as one column
    of doubles per plotted key (KEYS; NaN where not logged: a plotted number is finite): 8 bytes a number, not the
    file, nor a Python float in a tuple (~3.4 GB for the 1 GiB a run may log). A torn last line is skipped, and so is a plotted value that is not a number, with one note per
    key naming the file, the line and the key (one bad value in a long run should not cost the whole plot; null
    is the trainer's own "no value"); so is a value beyond MAX_DRAWN, which no axis can span."""
    path = metrics_file(run_dir)
    if not path.exists() and not path.is_symlink():
        raise UserError(f"no {METRICS_NAME} in {run_dir}; pass a training out_dir (train.out_dir) or the file itself")
    columns = {k: array("d") for k in KEYS}
    skipped: dict[tuple[str, str], list] = {}  # (key, why) -> [first line, its value, how many lines]
    damaged: list = []  # [first line, why, how many]: skipped, the rest still plots (as a resume drops them)
    torn = None  # the last line seen if it is not JSON: torn by a kill when nothing follows it, else damaged
    try:
        for number, line in _lines(path):
            if torn is not None:
                _count(damaged, torn, "not JSON")
                torn = None
            if isinstance(line, Damaged):  # over MAX_METRICS_LINE (read no further than the bound), or not UTF-8
                _count(damaged, number, line.why)
                continue
            if not line.strip():
                continue
            try:
                record = json_loads(line)  # a line nested too deep for the parser is "not JSON" too
            except ValueError:
                torn = number
                continue
            if not isinstance(record, dict) or "iter" not in record:
                continue  # not a step record
            bad = {k: fault(k, record[k]) for k in KEYS if k in record}
            bad = {k: reason for k, reason in bad.items() if reason}
            for key, reason in bad.items():
                first = skipped.setdefault((key, reason), [number, record[key], 0])
                first[2] += 1
            if "iter" in bad:
                continue  # no step to put the line at
            for k in KEYS:
                columns[k].append(NAN if k in bad or record.get(k) is None else record[k])
    except MemoryError:  # (the numbers dropped first: the line below needs memory too)
        kept, columns = len(columns["iter"]), {}
        raise UserError(f"{path}: out of memory holding the numbers of its first {kept:,} steps; plot a shorter "
                        "metrics file (e.g. every 10th line: awk 'NR % 10 == 1')") from None
    if not any(math.isfinite(v) for k in ("train/loss", "val/loss") for v in columns[k]):
        why = next((f" ({path} line {number}: {key} is {clipped(value)}, {reason})"
                    for (key, reason), (number, value, _) in skipped.items()
                    if key in ("iter", "train/loss", "val/loss")), "")
        raise UserError(f"{path} has no train or val loss yet{why}; plot again once the run has logged a step"
                        + (", or fix that line" if why else ""))
    if damaged:
        number, why, count = damaged
        more = f" (and {count - 1} more damaged line(s))" if count > 1 else ""
        print(f"note: {path} line {number} is damaged ({why}); skipped{more}", file=sys.stderr)
    for (key, why), (number, value, count) in skipped.items():
        more = f" (and {count - 1} more line(s) like it)" if count > 1 else ""
        what = "the line" if key == "iter" else "that value"
        print(f"note: {path} line {number}: {key} is {clipped(value)}, {why}; {what} skipped{more}", file=sys.stderr)
    return columns


def _count(damaged: list, number: int, why: str) -> None:
    if damaged:
        damaged[2] += 1
    else:
        damaged[:] = [number, why, 1]


def series(columns: dict[str, array], key: str, x: str) -> tuple[array, array]:
    """The points of `key` against `x` where both were logged, as doubles (no float objects)."""
    xs, ys = array("d"), array("d")
    for a, b in zip(columns[x], columns[key]):
        if math.isfinite(a) and math.isfinite(b):
            xs.append(a)
            ys.append(b)
    return xs, ys


def _compact(value: float, _pos=None) -> str:
    """A tick label that stays short: 150000 -> 150k, 1200000 -> 1.2M (full numbers run together)."""
    for factor, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{unit}"
    return f"{value:.3g}"


def make_figure(run_dirs: list[Path], *, log_scale: bool = False):
    """One figure, four titled panels, one colour per run: loss against step and against tokens seen
    (train solid, val dashed with markers), val bits per byte against step, the learning rate against step."""
    mpl = matplotlib_agg("plotting")
    FuncFormatter, MaxNLocator = mpl.ticker.FuncFormatter, mpl.ticker.MaxNLocator

    runs = {str(d): read_metrics(d) for d in run_dirs}
    fig = new_figure((13, 8.5), "plotting")
    loss_step, loss_tokens, bpb, lr = fig.subplots(2, 2).flat
    colors = mpl.rcParams["axes.prop_cycle"].by_key()["color"]
    if len(runs) > len(colors):  # every run drawn, each its own colour (a fixed list zipped with them dropped the rest)
        colors = [mpl.colormaps["turbo"](i / (len(runs) - 1)) for i in range(len(runs))]
    for i, (path, records) in enumerate(runs.items()):
        color = colors[i]
        name = drawable(path)
        def draw(ax, key, x, **style):  # nothing logged: no line, so the panel says "not logged", not an empty legend
            xs, ys = series(records, key, x)
            if xs:
                ax.plot(xs, ys, color=color, **style)

        for ax, x in ((loss_step, "iter"), (loss_tokens, "tokens_seen")):
            draw(ax, "train/loss", x, label=f"{name} train")
            draw(ax, "val/loss", x, linestyle="--", marker="o", markersize=3, label=f"{name} val")
        draw(bpb, "val/bpb", "iter", linestyle="--", marker="o", markersize=3, label=f"{name} val")
        draw(lr, "lr", "iter", label=name)
    panels = ((loss_step, "Loss by step", "step", "loss (nats/token)"),
              (loss_tokens, "Loss by tokens seen", "tokens seen", "loss (nats/token)"),
              (bpb, "Validation bits per byte", "step", "bits per byte"),
              (lr, "Learning rate", "step", "learning rate"))
    for ax, title, xlabel, ylabel in panels:
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
        ax.xaxis.set_major_formatter(FuncFormatter(_compact))
        ax.grid(color="#e7e7e7")  # the default grey at 30% on white, opaque: PostScript (.eps, .ps) has no alpha
        if ax.lines:
            literal_legend(ax, ax.lines, [line.get_label() for line in ax.lines], fontsize=8, framealpha=1.0)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
    if log_scale:
        for ax in (loss_step, loss_tokens, bpb):
            if any(y > 0 for line in ax.lines for y in line.get_ydata()):  # (none: matplotlib's warning, linear)
                ax.set_yscale("log")
                # a loss spans less than a decade: plain numbers at even steps, not "4 x 10^0" at 3 and 4
                ax.yaxis.set_major_locator(MaxNLocator(nbins=8))
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.3g}"))
                ax.yaxis.set_minor_formatter(mpl.ticker.NullFormatter())
    fig.suptitle(f"Training curves: {', '.join(map(drawable, runs))}", fontsize=11)
    fig.tight_layout()
    return fig


def resolve_out(out: str | Path | None, runs: list[Path]) -> Path:
    """The file to write (resolve_output's, without who named it)."""
    return resolve_output(out, runs)[0]


def resolve_output(out: str | Path | None, runs: list[Path]) -> tuple[Path, bool]:
    """The file to write, and whether this command picked its name: --out as given when its suffix is one
    matplotlib writes (named by the user); a folder gets curves.png inside, and so does a name ending in a
    separator (`figs/`: made if it is not there yet); a name without a suffix gets .png; no --out:
    <first run>/curves.png (picked, all three). Said by the branch taken, not by comparing spellings: `./c.png`,
    `dir//c.png` and `a/../a/c.png` are names the user gave."""
    if out is None:
        return (runs[0] / "curves.png" if runs[0].is_dir() else runs[0].with_suffix(".png")), True
    # the trailing separator is read from the text: Path("figs/") is Path("figs"), a file named figs.png below
    says_folder = isinstance(out, str) and out.endswith(tuple(s for s in (os.sep, os.altsep) if s))
    out = Path(out)
    if says_folder and out.exists() and not out.is_dir():
        raise UserError(f"--out {out}{os.sep} names a folder, but {out} is a file; choose another --out")
    if says_folder or out.is_dir():
        return out / "curves.png", True
    if output_target(out, "--out")[1]:  # a device or a FIFO: written straight into, as PNG, never renamed
        return out, False
    if not out.suffix:  # `c` and `c.` (an empty suffix: not c..png) are both c.png
        stem = out.name.rstrip(".")
        return (out.with_name(stem + ".png") if stem else out.with_name(out.name + ".png")), True
    matplotlib_agg("plotting")  # (its one line where matplotlib is missing, before the formats it writes)
    check_format(out.suffix, "--out", out)
    return out, False


def plot(run_dirs: list[Path], out: Path, *, log_scale: bool = False) -> Path:
    # never over a metrics file it reads (`--out run/metrics.svg` when that is the file passed)
    check_output_not_input(out, [(f"the metrics file {metrics_file(r)}", metrics_file(r)) for r in run_dirs], "--out")
    # the gate: in no folder another command manages, but the out_dir of a run it plots (curves.png, the default)
    runs = {Path(os.path.realpath(r if Path(r).is_dir() else Path(r).parent)) for r in run_dirs}
    parent = Path(os.path.realpath(out)).parent
    check_output(out, "--out", home=parent if parent in runs else None)
    fig = make_figure(run_dirs, log_scale=log_scale)  # every input is checked before anything is written
    try:
        target, straight = output_target(out, "--out")
        if straight:  # a device or a FIFO: drawn whole first, as a PNG writer seeks, which a FIFO cannot
            image = io.BytesIO()
            save_figure(fig, image, "png", dpi=110, name=out)
            atomic_write_bytes(out, image.getvalue(), "--out", follow=True)
        else:
            with no_empty_dirs_left(target.parent):  # a failed write leaves none of the folders made for it
                target.parent.mkdir(parents=True, exist_ok=True)  # `--out docs/curves.png` in a fresh clone
                remove_stale_temps(target.parent, name=target.name)  # what a plot killed mid-write left
                with atomic_write(out, "--out", follow=True) as tmp:  # a failure (a full disk) leaves the old PNG
                    save_figure(fig, tmp, out.suffix.lstrip(".").lower() or "png", dpi=110, name=out)
    except OSError as e:
        if reader_left(e):  # --out /dev/stdout | head: run_cli's quiet end
            raise
        raise UserError(f"cannot write {out} ({short_error(e)}); choose another --out") from None
    return out


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m training.plot", description=__doc__.split("\n\n")[0])  # the paragraph: its first line stops mid-sentence
    p.add_argument("runs", nargs="+", type=path_arg_path, help="training out_dirs (or metrics.jsonl files)")
    # a str, not a Path: resolve_out reads a trailing separator (`--out figs/`), which Path drops
    p.add_argument("--out", type=path_arg, default=None,
                   help="the image to write: .png, .pdf, .svg, ...; a folder (or a name ending in /) gets "
                        "curves.png (default: <first run>/curves.png)")
    p.add_argument("--log-scale", action="store_true", help="logarithmic loss and bits-per-byte axes")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # an unknown suffix is refused before any reading or drawing; picked: a name it chose (curves.png in a folder,
    # .png added), never written over a user's file of that name in a folder of the user's: only over its own picture
    out, picked = resolve_output(args.out, args.runs)
    if picked:
        check_replaceable(out.parent, (out.name,), "--out")
    print(plot(args.runs, out, log_scale=args.log_scale))
    # recorded where it picked the name, and where the user named a file in a folder that has a record (else the
    # record would still hold the earlier picture's digest, and `--out folder/` then refused its own curves.png)
    record_written(out.parent, (out.name,), "--out", create=picked)
    return 0


if __name__ == "__main__":
    errors.start_up_done()  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    run_cli(main)
