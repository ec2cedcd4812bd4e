"""matplotlib, loaded one way for every figure this project draws (eval/figures.py's, training/plot.py's,
benchmarks/gpu_curves.py's): the only file that imports it (tests/test_architecture_rules.py checks).

Our figures are always files drawn by Agg, so two of matplotlib's global settings have no meaning for them and
only break them: MPLBACKEND (a bad value, `MPLBACKEND=agg2`, makes `import matplotlib` itself raise) and
mathtext (a `$` in a run's path, a title or the inspected text was parsed as TeX: a ParseFatalException, or
`price$5 and $6` drawn as italic math). Here MPLBACKEND is not read, and text is drawn as it is written.
"""
from __future__ import annotations

import importlib
import os
import sys
import warnings
from types import ModuleType

from errors import UserError, short_error

# the largest |value| an axis is drawn over: the span of two values, the axis' margins and its ticks stay finite
# (1e308 then -1e308 overflowed to inf there, an exception in tight_layout; so did 1.7e308 alone, with margins; a
# log axis from 5e-324 to 1e300 overflowed its margin). No loss, rate, count or time of a run comes near it.
MAX_DRAWN = 1e200
# Formats matplotlib lists that need a program outside Python: never offered (`.pgf` was, and its writer raised
# "'xelatex' not found", a traceback)
OUTSIDE_PYTHON = {"pgf": "a TeX engine (xelatex)"}
# what the project draws with, imported here (after matplotlib itself) so that no other file imports matplotlib
SUBMODULES = ("backends.backend_agg", "figure", "ticker", "colors", "cm", "patches", "font_manager", "ft2font")


def matplotlib_agg(what: str = "drawing the figures") -> ModuleType:
    """matplotlib, with SUBMODULES imported, Agg selected and mathtext off; `what` names the missing-matplotlib
    hint's task ("plotting needs matplotlib, ...")."""
    # matplotlib reads MPLBACKEND once, while it is imported, and a value it does not know raises there: the
    # variable is hidden for that import only (the environment is as it was after, for any child process)
    hidden = None if "matplotlib" in sys.modules else os.environ.pop("MPLBACKEND", None)
    try:
        mpl = importlib.import_module("matplotlib")
        for name in SUBMODULES:
            importlib.import_module(f"matplotlib.{name}")
    except ImportError:
        raise UserError(f"{what} needs matplotlib, which is not installed; pip install matplotlib") from None
    finally:
        if hidden is not None:
            os.environ["MPLBACKEND"] = hidden
    mpl.use("Agg")  # files only: no display (our figures have their own Agg canvas; pyplot, if anyone's, too)
    # user text (paths, descriptions, the inspected text) is drawn literally; none of our own labels uses math
    mpl.rcParams["text.parse_math"] = False
    return mpl


def new_figure(figsize: tuple[float, float], what: str = "drawing the figures"):
    """A Figure on its own Agg canvas: no pyplot, so no display, no global list of open figures to close."""
    mpl = matplotlib_agg(what)
    fig = mpl.figure.Figure(figsize=figsize)
    mpl.backends.backend_agg.FigureCanvasAgg(fig)
    return fig


def image_formats() -> set[str]:
    """The file suffixes (no dot, lower case) a figure is written as with nothing but Python's packages."""
    return set(new_figure((1, 1)).canvas.get_supported_filetypes()) - set(OUTSIDE_PYTHON)


def check_format(suffix: str, option: str, out) -> str:
    """The format a file's suffix (".png") names, or one line: `option` `out` cannot be written as that."""
    fmt = suffix.lstrip(".").lower()
    formats = image_formats()
    if fmt not in formats:
        why = f" (they need {OUTSIDE_PYTHON[fmt]}, outside Python)" if fmt in OUTSIDE_PYTHON else ""
        raise UserError(f"{option} {out}: cannot write {suffix!r} files{why}; use one of "
                        f"{', '.join('.' + f for f in sorted(formats))} (e.g. .png)")
    return fmt


def save_figure(fig, file, fmt: str, *, dpi: float, name) -> None:
    """fig written to `file` (a path or a binary file) as `fmt`. An OSError is the caller's to say (a full disk, a
    closed pipe); any other failure of the format's writer is one line naming `name`, the output."""
    try:
        with warnings.catch_warnings():  # placing a legend over 2M points is slow, and matplotlib said so on stderr,
            warnings.filterwarnings("ignore", message="Creating legend with loc")  # with its source path: not ours
            fig.savefig(file, dpi=dpi, format=fmt)
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 (a writer's own fault, whatever its type: one line, not a traceback)
        raise UserError(f"cannot write {name} as .{fmt} ({short_error(e)}); choose another suffix, e.g. .png") from None


def drawable(text: str) -> str:
    """`text` as a figure draws it: as it is, but for the bytes of a path that are not UTF-8, which Python holds
    as lone surrogates that Agg refuses (a TypeError while drawing): those as \\xNN, as a terminal would show them."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file name decodes to: as its code point, \\ud800
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def literal_legend(ax, handles: list, labels: list[str], **kwargs):
    """ax.legend with every label shown as it is: matplotlib leaves out a label that starts with "_" (a run
    folder named _old), so each entry is made with a placeholder and its text set after."""
    legend = ax.legend(handles, ["x"] * len(handles), **kwargs)
    for text, label in zip(legend.get_texts(), labels):
        text.set_text(label)
    return legend
