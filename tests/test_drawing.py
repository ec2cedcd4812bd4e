"""eval/drawing.py, the one way the project loads matplotlib, and the commands that draw through it
(python -m training.plot, python -m eval.inspect, python -m benchmarks.gpu_curves): whatever the environment
and the user's text, every figure is drawn, as it was written, into a file of a format that needs nothing
outside Python, or the command says one line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

from checkpoint import save_checkpoint
from test_inspect import TEXT, checkpoint_payload, tiny_model
from test_plot import write_run

ROOT = Path(__file__).resolve().parents[1]

# what an environment variable can hold: no NUL, no lone surrogate (os.environ refuses both)
ENV_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), min_size=1, max_size=20)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "ckpt.pt"
    save_checkpoint(path, checkpoint_payload(tiny_model()))
    return path


def command(args: list, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


# ------------------------------------------------------------------------------------------ MPLBACKEND

@settings(max_examples=3)
@example(backend="agg2")
@given(backend=ENV_TEXT)
def test_a_bad_mplbackend_changes_no_plot(tmp_path_factory, backend):
    """Before: MPLBACKEND=agg2 made `import matplotlib` raise ValueError, a traceback. The variable means nothing
    to a picture written to a file: the plot is drawn, exit 0 (a fresh interpreter: matplotlib reads it once)."""
    tmp = tmp_path_factory.mktemp("mplbackend")
    run = write_run(tmp / "run")
    done = command(["-m", "training.plot", run, "--out", tmp / "c.png"], {"MPLBACKEND": backend})
    assert done.returncode == 0, done.stderr
    assert (tmp / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and done.stdout.strip() == str(tmp / "c.png")


@settings(max_examples=2)
@example(backend="agg2")
@given(backend=ENV_TEXT)
def test_a_bad_mplbackend_changes_no_inspection(tmp_path_factory, ckpt, backend):
    tmp = tmp_path_factory.mktemp("mplbackend")
    done = command(["-m", "eval.inspect", "--checkpoint", ckpt, "--text", TEXT[:12], "--out", tmp],
                   {"MPLBACKEND": backend})
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp.iterdir()) == ["attention.png", "surprisal.html", "surprisal.png"]
    assert (tmp / "attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_loader_hides_mplbackend_only_while_it_imports(monkeypatch):
    """In process (matplotlib already imported here): the variable is left as it was, for any child process."""
    from eval.drawing import matplotlib_agg

    monkeypatch.setenv("MPLBACKEND", "agg2")
    mpl = matplotlib_agg()
    assert os.environ["MPLBACKEND"] == "agg2" and mpl.get_backend().lower() == "agg"
