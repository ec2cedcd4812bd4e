"""matplotlib, loaded one way for every figure this project draws (eval/figures.py's, training/plot.py's,
benchmarks/gpu_curves.py's): the only file that imports it (tests/test_architecture_rules.py checks).

Our figures are always files drawn by Agg, so MPLBACKEND has no meaning for them and only breaks them: a bad
value (`MPLBACKEND=agg2`) makes `import matplotlib` itself raise. Here it is not read.
"""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from errors import UserError

# what the project draws with, imported here (after matplotlib itself) so that no other file imports matplotlib
SUBMODULES = ("backends.backend_agg", "figure", "ticker", "colors", "cm", "patches", "font_manager", "ft2font")


def matplotlib_agg(what: str = "drawing the figures") -> ModuleType:
    """matplotlib, with SUBMODULES imported and Agg selected; `what` names the missing-matplotlib
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
    return mpl


def new_figure(figsize: tuple[float, float], what: str = "drawing the figures"):
    """A Figure on its own Agg canvas: no pyplot, so no display, no global list of open figures to close."""
    mpl = matplotlib_agg(what)
    fig = mpl.figure.Figure(figsize=figsize)
    mpl.backends.backend_agg.FigureCanvasAgg(fig)
    return fig
