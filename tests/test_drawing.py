"""eval/drawing.py, the one way the project loads matplotlib, and the commands that draw through it
(python -m training.plot, python -m eval.inspect, python -m benchmarks.gpu_curves): whatever the environment
and the user's text, every figure is drawn, as it was written, into a file of a format that needs nothing
outside Python, or the command says one line."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import matplotlib.colors as matplotlib_colors
from hypothesis import example, given, settings, strategies as st

import ownership
from checkpoint import save_checkpoint
from errors import UserError
from eval.drawing import new_figure
from eval.figures import figure_png
from figure_inputs import TEXT, checkpoint_payload, tiny_model, write_run
import warm_runs

ROOT = Path(__file__).resolve().parents[1]

# what an environment variable can hold: no NUL, no lone surrogate (os.environ refuses both)
ENV_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), min_size=1, max_size=20)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "ckpt.pt"
    save_checkpoint(path, checkpoint_payload(tiny_model()))
    return path


def command(args: list, env: dict) -> subprocess.CompletedProcess:
    return warm_runs.run(args, cwd=ROOT, env={**os.environ, **env})


# ------------------------------------------------------------------------------------------ MPLBACKEND

@settings(max_examples=2)  # (each a fresh interpreter)
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


@settings(max_examples=1)  # (each a fresh interpreter loading a checkpoint)
@example(backend="agg2")
@given(backend=ENV_TEXT)
def test_a_bad_mplbackend_changes_no_inspection(tmp_path_factory, ckpt, backend):
    tmp = tmp_path_factory.mktemp("mplbackend")
    done = command(["-m", "eval.inspect", "--checkpoint", ckpt, "--text", TEXT[:12], "--out", tmp],
                   {"MPLBACKEND": backend})
    assert done.returncode == 0, done.stderr
    pictures = sorted(p.name for p in tmp.iterdir() if p.name != ownership.WRITTEN)  # (the record of what it wrote)
    assert pictures == ["attention.png", "surprisal.html", "surprisal.png"]
    assert (tmp / "attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_loader_hides_mplbackend_only_while_it_imports(monkeypatch):
    """In process (matplotlib already imported here): the variable is left as it was, for any child process."""
    from eval.drawing import matplotlib_agg

    monkeypatch.setenv("MPLBACKEND", "agg2")
    mpl = matplotlib_agg()
    assert os.environ["MPLBACKEND"] == "agg2" and mpl.get_backend().lower() == "agg"


# ------------------------------------------------------------------------------------------ text drawn as written

# a file name: any bytes but NUL and /, read back as Python holds them (bytes that are not UTF-8 as lone surrogates)
NAMES = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0/"), min_size=1, max_size=30),
    st.binary(min_size=1, max_size=30).filter(lambda b: b"\0" not in b and b"/" not in b).map(os.fsdecode),
).filter(lambda name: name not in (".", "..") and len(os.fsencode(name)) <= 255)
MATH = ["m$\\foo{$", "price$5 and $6", "$x^2$", "_old", os.fsdecode(b"run\xff$a$")]  # parsed as TeX before


def as_drawn(text: str) -> str:
    """The reference: text as it is, the bytes of a name that are not UTF-8 as a terminal shows them (\\xff)."""
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def assert_literal(fig) -> list[str]:
    """Every text of the drawn figure is drawn as it is written (no mathtext); its texts."""
    import matplotlib.text

    fig.canvas.draw()  # (tick labels exist once drawn; drawing is where mathtext raised)
    texts = fig.findobj(matplotlib.text.Text)
    parsed = [t.get_text() for t in texts if t._preprocess_math(t.get_text())[1]]
    assert not parsed, f"drawn as math: {parsed}"
    return [t.get_text() for t in texts]


@pytest.mark.filterwarnings("ignore:Glyph")
@settings(max_examples=max(5, settings().max_examples // 2))  # (each draws a whole figure)
@given(names=st.lists(NAMES, min_size=1, max_size=2, unique_by=os.fsencode))
@example(names=MATH[:3])
@example(names=MATH[3:])
def test_run_names_are_drawn_as_written(tmp_path_factory, names):
    """Before: `python -m training.plot 'm$\\foo{$'` exited 1 with ParseFatalException, `price$5 and $6` was drawn
    as italic math, a run folder named _old was left out of the legends, and a name that is not UTF-8 was a
    TypeError. The suptitle and every legend entry are the names as written."""
    from training import plot

    root = tmp_path_factory.mktemp("names")
    runs = [write_run(root / name) for name in names]
    fig = plot.make_figure(runs)
    assert_literal(fig)
    shown = [as_drawn(str(r)) for r in runs]
    assert fig._suptitle.get_text() == f"Training curves: {', '.join(shown)}"
    expected = ([[f"{n} {s}" for n in shown for s in ("train", "val")]] * 2 + [[f"{n} val" for n in shown], shown])
    assert [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes] == expected


@pytest.mark.filterwarnings("ignore:Glyph")
@settings(max_examples=max(5, settings().max_examples // 2))  # (each draws a whole figure)
@given(description=NAMES, labels=st.lists(st.text(min_size=1, max_size=4), min_size=2, max_size=5))
@example(description=MATH[0], labels=["$a", "b$", "$\\foo{", "$x$"])
@example(description=MATH[1], labels=["price", "$5", " and ", "$6"])
def test_descriptions_and_tokens_are_drawn_as_written(description, labels):
    """eval/figures.py's titles carry the checkpoint's description (its path) and its cells and ticks the
    inspected text's tokens: drawn as written (whitespace made visible, as shown() says), never as math."""
    import torch

    from eval.figures import Inspection, attention_figure, shown, surprisal_figure

    t = len(labels)
    attention = (torch.tril(torch.ones(2, 2, t, t)) / torch.arange(1, t + 1).view(1, 1, t, 1))
    insp = Inspection(list(range(t)), labels, attention, [float("nan")] + [1.0] * (t - 1),
                      [[(0, labels[0], 0.5), (1, labels[-1], 0.25)]] * t, 100, description)
    for fig, cut in ((attention_figure(insp), 12), (attention_figure(insp, 1, 0), 12), (surprisal_figure(insp), 10)):
        texts = assert_literal(fig)
        title = fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()
        assert title.endswith(as_drawn(description)), title
        assert {shown(label, cut) for label in labels} <= set(texts)


def test_none_of_our_own_labels_is_math(tmp_path):
    """Mathtext is off for every figure: no label of ours may rely on it (a `$` would now be drawn as a `$`)."""
    from training import plot

    run = write_run(tmp_path / "run")
    for log_scale in (False, True):
        texts = assert_literal(plot.make_figure([run], log_scale=log_scale))
        assert not [t for t in texts if "$" in t or "\\" in t], texts


def gpu_round(folder: Path, card: str) -> Path:
    """A round's logs as benchmarks/gpu_round.sh stamps them, with `card` in its summary."""
    folder.mkdir(parents=True)
    (folder / "ours_char.log").write_text("".join(f"  {10.0 * i:.1f} iter {100 * i}: train loss 2.0, val loss "
                                                  f"{4.2 - 0.5 * i:.4f}\n" for i in range(5)))
    (folder / "summary.txt").write_text(f"######## 12:00 {card}, 80 GB, 550\n")
    return folder


@pytest.mark.parametrize("card", MATH[:3])
def test_the_gpu_curves_card_is_drawn_as_written(tmp_path, card, capsys, monkeypatch):
    """benchmarks/gpu_curves.py draws the card of a round's summary.txt in its titles: as written, too."""
    from benchmarks import gpu_curves

    drawn = []
    monkeypatch.setattr(gpu_curves, "new_figure", lambda size: drawn.append(new_figure(size)) or drawn[-1])
    assert gpu_curves.main([str(gpu_round(tmp_path / "logs", card)), str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_literal(drawn[0])
    assert drawn[0].axes[0].get_title().endswith(card)


# ------------------------------------------------------------------------------------------ numbers an axis spans

FINITE = st.floats(allow_nan=False, allow_infinity=False)  # every finite double: huge, tiny, subnormal, -0.0
PLOTTED = ("iter", "tokens_seen", "train/loss", "val/loss", "val/bpb", "lr")


def step_lines(draw_value) -> st.SearchStrategy:
    """Metrics lines whose plotted keys take any finite values (iter: any whole number a double holds)."""
    value = {k: (st.integers(-2**1023, 2**1023) | st.integers(-10, 10)) if k == "iter" else draw_value for k in PLOTTED}
    return st.lists(st.fixed_dictionaries({}, optional=value), min_size=1, max_size=6)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # numpy's overflow warnings are on the user's stderr too
@pytest.mark.filterwarnings("error::UserWarning")  # (and "Data has no positive values", a log axis of none)
@settings(max_examples=max(5, settings().max_examples // 2))  # (each draws a whole figure)
@given(lines=step_lines(FINITE), log_scale=st.booleans())
@example(lines=[{"iter": 1, "train/loss": 1e308, "lr": 1e308, "tokens_seen": 1e308},
                {"iter": 2, "train/loss": -1e308, "lr": -1e308, "tokens_seen": -1e308}], log_scale=False)
@example(lines=[{"iter": 1, "train/loss": 1.7e308}, {"iter": 2, "train/loss": 5e-324, "lr": 5e-324}], log_scale=True)
@example(lines=[{"iter": 1, "train/loss": 1e200}, {"iter": 2, "train/loss": 5e-324}, {"iter": 3, "val/bpb": -1.0}],
         log_scale=True)
@example(lines=[{"iter": 10**308, "train/loss": 1.0}, {"iter": -10**308, "train/loss": 2.0}], log_scale=False)
def test_any_finite_numbers_plot_and_what_no_axis_spans_is_a_note(tmp_path_factory, lines, log_scale, capsys):
    """Before: train/loss 1e308 then -1e308 (or lr, tokens_seen) was `ValueError: arange: cannot compute length`
    in tight_layout. A value beyond MAX_DRAWN either way is skipped with a note naming the file, the line and the
    key (a step beyond it: the line), as a value that is not a number is; everything else is drawn as logged."""
    import json

    from training import plot

    run = tmp_path_factory.mktemp("numbers") / "metrics.jsonl"
    run.write_text("".join(json.dumps(line) + "\n" for line in lines))
    within = [line for line in lines if "iter" in line and abs(line["iter"]) <= 1e200]
    kept = {k: [line[k] for line in within if k in line and abs(line[k]) <= 1e200] for k in PLOTTED}
    if not kept["train/loss"] + kept["val/loss"]:
        with pytest.raises(UserError, match="has no train or val loss yet"):
            plot.read_metrics(run)
        return
    columns = plot.read_metrics(run)
    assert {k: [v for v in columns[k] if v == v] for k in PLOTTED} == kept  # (NaN: not logged)
    beyond = [(n, k) for n, line in enumerate(lines, 1) if "iter" in line  # (a line without a step is no record)
              for k in PLOTTED if k in line and abs(line[k]) > 1e200]
    err = capsys.readouterr().err
    for n, k in beyond:  # each key's first such line is named
        if (n, k) == min((m, j) for m, j in beyond if j == k):
            assert f"{run} line {n}: {k} is " in err and "beyond 1e+200" in err, err
    fig = plot.make_figure([run], log_scale=log_scale)
    figure_png(fig)


def test_a_round_log_number_no_axis_spans_is_a_note(tmp_path, capsys):
    """benchmarks/gpu_curves.py reads its numbers from a round's logs: a second eval's val loss of 400 digits (inf
    as a float) was a traceback setting the loss axis' limits to it; the line is left out with a note."""
    from benchmarks import gpu_curves

    logs = gpu_round(tmp_path / "logs", "H100")
    lines = (logs / "ours_char.log").read_text().splitlines(keepends=True)
    lines[1] = f"  10.0 iter 100: train loss 2.0, val loss {'9' * 400}\n"
    (logs / "ours_char.log").write_text("".join(lines))
    assert gpu_curves.main([str(logs), str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 0
    assert f"{logs / 'ours_char.log'} line 2: a number beyond 1e+200" in capsys.readouterr().err
    assert [step for _, step, _ in gpu_curves.val_curve(logs / "ours_char.log", gpu_curves.OURS)] == [0, 200, 300, 400]


# ------------------------------------------------------------------------------------------ formats offered

def test_every_format_offered_writes_a_file_in_process(tmp_path, capsys, monkeypatch):
    """Before: `--out c.pgf` was offered (the refusal's list is matplotlib's) and printed RuntimeError 'xelatex'
    not found, a traceback. Every suffix the refusal offers now writes a non-empty file, with nothing on stderr.
    (The command's whole path for each suffix, the figure made once: 0.6 s a figure, 13 suffixes.)"""
    from errors import run_cli
    from training import plot

    run = write_run(tmp_path / "run")
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: plot.main([str(run), "--out", str(tmp_path / "c.nope")]))
    err = capsys.readouterr().err
    offered = err.split("use one of ", 1)[1].split(" (e.g.")[0].split(", ")
    assert e.value.code == 2 and ".png" in offered and ".pgf" not in offered, err
    figure = plot.make_figure([run])
    monkeypatch.setattr(plot, "make_figure", lambda runs, **kwargs: figure)
    for suffix in offered:
        assert plot.main([str(run), "--out", str(tmp_path / f"c{suffix}")]) == 0
        assert (tmp_path / f"c{suffix}").stat().st_size > 0, suffix
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("entry", ["training.plot", "benchmarks.gpu_curves"])
def test_pgf_and_a_failing_writer_are_one_line_and_keep_the_file_there(entry, tmp_path, capsys, monkeypatch):
    """A format no writer here has (.pgf: a TeX engine) is refused before drawing; a writer that fails anyway
    (any exception of its own) is one line naming the output, and the file already at that path is kept."""
    import matplotlib.figure

    from benchmarks import gpu_curves
    from errors import run_cli
    from training import plot

    if entry == "training.plot":
        main, inputs = plot.main, [str(write_run(tmp_path / "run"))]
    else:
        main, inputs = gpu_curves.main, [str(gpu_round(tmp_path / "logs", "H100"))]

    for out, words in ((tmp_path / "c.pgf", "cannot write '.pgf' files (they need a TeX engine"),
                       (tmp_path / "c.svg", "cannot write " + str(tmp_path / "c.svg") + " as .svg (RuntimeError: no")):
        out.write_bytes(b"kept")
        args = [*inputs, "--out", str(out)] if entry == "training.plot" else [*inputs, str(out)]
        if out.suffix == ".svg":
            monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda *a, **k: (_ for _ in ()).throw(
                RuntimeError("no writer today")))
        with pytest.raises(SystemExit) as e:
            run_cli(lambda: main(args))
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and words in err, err
        assert out.read_bytes() == b"kept" and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


# ------------------------------------------------------------------------------------------ every run drawn

@settings(max_examples=3)
@given(count=st.integers(1, 30))
@example(count=101)
@pytest.mark.filterwarnings("ignore:Tight layout not applied")  # (101 legends entries do not fit: drawn all the same)
def test_every_run_given_is_drawn(tmp_path_factory, count):
    """Before: a list of ten cycles of colours was zipped with the runs: 101 run folders drew 100, silently. Each
    run is drawn in every panel, in a colour of its own."""
    from training import plot

    root = tmp_path_factory.mktemp("runs")
    runs = [write_run(root / f"r{i}", steps=3) for i in range(count)]
    fig = plot.make_figure(runs)
    loss_step, _, _, lr = fig.axes
    assert [line.get_label() for line in lr.lines] == [str(r) for r in runs]
    assert len(loss_step.lines) == 2 * count
    assert len({tuple(matplotlib_colors.to_rgba(line.get_color())) for line in lr.lines}) == count


# ------------------------------------------------------------------------------------------ the smaller ones

@pytest.mark.parametrize("kind", ["fifo", "null_device"])
def test_a_metrics_file_that_is_no_regular_file_is_named_so(tmp_path, kind, capsys):
    """Before: a FIFO given as metrics.jsonl (nobody writing it) read as empty: "has no train or val loss yet"."""
    from errors import run_cli
    from hostile_world import make_kind
    from training import plot

    path = make_kind(kind, tmp_path / "metrics.jsonl")
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: plot.main([str(path), "--out", str(tmp_path / "c.png")]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "not a regular file" in err and "loss" not in err, err
    assert not (tmp_path / "c.png").exists()


@given(stem=st.text("abc_-1", min_size=1, max_size=6), dots=st.integers(0, 2))
def test_a_name_with_no_or_an_empty_suffix_gets_png(tmp_path_factory, stem, dots):
    """Before: `--out c.` wrote c..png. A name with no suffix or an empty one (`c`, `c.`) is written as c.png."""
    from training import plot

    root = tmp_path_factory.mktemp("names")
    assert plot.resolve_out(str(root / (stem + "." * dots)), [root]) == root / f"{stem}.png"


@pytest.mark.parametrize("entry", ["training.plot", "benchmarks.gpu_curves"])
@pytest.mark.parametrize("suffix", [".eps", ".ps"])
def test_postscript_is_written_without_the_transparency_warning(entry, suffix, tmp_path, caplog):
    """Before: `--out x.eps` logged matplotlib's "The PostScript backend does not support transparency" on stderr
    (the grid's alpha, the legends' frames): the figures have no transparency now."""
    from benchmarks import gpu_curves
    from training import plot

    out = tmp_path / f"x{suffix}"
    if entry == "training.plot":
        assert plot.main([str(write_run(tmp_path / "run")), "--out", str(out), "--log-scale"]) == 0
    else:
        assert gpu_curves.main([str(gpu_round(tmp_path / "logs", "H100")), str(out)]) == 0
    assert out.read_bytes()[:4] == b"%!PS" and not [r.getMessage() for r in caplog.records], caplog.records


def test_matplotlibs_slow_legend_warning_is_not_printed_and_other_warnings_are(tmp_path):
    """Found from outside: `python -m training.plot` of a 2M-line metrics.jsonl printed matplotlib's 'Creating
    legend with loc="best" can be slow' with its source path on stderr. That one is dropped while saving a
    figure; any other warning of a draw still reaches the user."""
    import io
    import warnings

    from matplotlib.artist import Artist
    from matplotlib.figure import Figure

    from eval.drawing import save_figure

    class Noisy(Artist):
        def __init__(self, text):
            super().__init__()
            self.text = text

        def draw(self, renderer):
            warnings.warn(self.text, UserWarning)

    for text, shown in (('Creating legend with loc="best" can be slow with large amounts of data.', False),
                        ("some other warning", True)):
        fig = Figure(figsize=(1, 1))
        fig.add_artist(Noisy(text))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            save_figure(fig, io.BytesIO(), "png", dpi=20, name="x.png")
        assert any(text in str(w.message) for w in seen) == shown, (text, [str(w.message) for w in seen])
