"""python -m training.plot: curves of one or more runs from their metrics.jsonl, without wandb."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import ownership
from errors import run_cli
from training import plot
from training.report import metrics

from figure_inputs import write_run

ROOT = Path(__file__).resolve().parents[1]


def test_two_runs_in_one_figure_with_train_val_bpb_and_lr_curves(tmp_path):
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b", scale=0.9)
    fig = plot.make_figure([a, b])
    loss_step, loss_tokens, bpb, lr = fig.axes
    assert len(loss_step.lines) == len(loss_tokens.lines) == 4 and len(lr.lines) == len(bpb.lines) == 2
    assert [ax.get_title() for ax in fig.axes] == ["Loss by step", "Loss by tokens seen", "Validation bits per byte",
                                                  "Learning rate"]
    assert list(bpb.lines[0].get_ydata()) == pytest.approx([(5.2 - 1.5) / 0.6931, (5.2 - 3.0) / 0.6931])
    assert fig._suptitle.get_text() == f"Training curves: {a}, {b}"
    train_a = loss_step.lines[0]
    assert list(train_a.get_xdata()) == [1, 2, 3, 4, 5, 6] and list(train_a.get_ydata())[0] == 4.5
    val_a = loss_tokens.lines[1]
    assert list(val_a.get_xdata()) == [384, 768] and list(val_a.get_ydata()) == pytest.approx([3.7, 2.2])
    assert loss_tokens.get_xlabel() == "tokens seen" and lr.get_ylabel() == "learning rate"


def test_the_cli_writes_a_png(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: plot.main([str(a)]))
    assert e.value.code == 0
    png = (a / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert (width, height) == (1430, 935)  # 13 x 8.5 inches at 110 dpi
    assert capsys.readouterr().out.strip() == str(a / "curves.png")


@pytest.mark.parametrize("make,words", [
    (lambda d: d, "no metrics.jsonl"),
    (lambda d: (d.mkdir(), (d / "metrics.jsonl").write_text(""))[0] or d, "no train or val loss"),
])
def test_bad_inputs_are_one_line(tmp_path, capsys, make, words):
    run_dir = make(tmp_path / "run")
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: plot.main([str(run_dir)]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_a_torn_last_line_is_skipped_and_an_unwritable_out_is_one_line(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    with open(a / "metrics.jsonl", "a") as f:
        f.write('{"iter": 7, "train/lo')  # a run killed mid-write
    assert len(plot.read_metrics(a)["iter"]) == 6
    assert plot.main([str(a), "--out", str(tmp_path / "new" / "dir" / "x.png")]) == 0  # folders are made
    assert (tmp_path / "new" / "dir" / "x.png").stat().st_size > 0
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: plot.main([str(a), "--out", str(tmp_path / "file" / "x.png")]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: cannot write") and len(err.strip().splitlines()) == 1


def test_without_matplotlib_the_hint_is_one_line(tmp_path):
    a = write_run(tmp_path / "a")
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nsys.modules['matplotlib'] = None\n")
    r = subprocess.run([sys.executable, "-m", "training.plot", str(a)], cwd=ROOT, capture_output=True, text=True,
                       env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == ("error: plotting needs matplotlib, which is not installed; "
                                                     "pip install matplotlib")


def test_the_plot_is_written_atomically_and_a_killed_plots_temp_is_removed(tmp_path, monkeypatch):
    import matplotlib.figure

    from errors import UserError

    a = write_run(tmp_path / "a")
    out = tmp_path / "curves.png"
    leftover = tmp_path / ".curves.png.999999999-5.0123abcd.tmp"  # a pid above any pid_max: its writer is gone
    leftover.write_bytes(b"half a png")
    other = tmp_path / ".notes.txt.999999999-5.0123abcd.tmp"  # another file's temp: not the plot's to remove
    other.write_bytes(b"x")
    plot.plot([a], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not leftover.exists() and other.exists()

    before = out.read_bytes()

    def disk_full(self, fname, **kwargs):
        Path(fname).write_bytes(b"partial")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", disk_full)
    with pytest.raises(UserError, match="No space left on device"):
        plot.plot([a], out)
    assert out.read_bytes() == before and not list(tmp_path.glob(".curves.png.*.tmp"))


def test_token_tick_labels_are_short_and_do_not_run_together(tmp_path):
    """Token counts in the hundreds of thousands: the full numbers ("1000001200001400000") ran into each
    other; the labels are compact (150k, 1.2M) and there are few of them."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"iter": i, "train/loss": 3 - i / 1000, "tokens_seen": 768 * i, "lr": 1e-3}) + "\n"
        for i in range(10, 2010, 10)))
    fig = plot.make_figure([run])
    fig.canvas.draw()
    tokens_axis = fig.axes[1]
    labels = [t.get_text() for t in tokens_axis.get_xticklabels() if t.get_text()]
    assert 3 <= len(labels) <= 8 and all(len(l) <= 5 for l in labels), labels
    assert any(l.endswith("M") for l in labels) and any(l.endswith("k") for l in labels), labels
    boxes = [t.get_window_extent() for t in tokens_axis.get_xticklabels() if t.get_text()]
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:])), "tick labels overlap"
    assert plot._compact(1_500_000) == "1.5M" and plot._compact(150_000) == "150k" and plot._compact(42) == "42"


def test_log_scale_puts_loss_and_bpb_on_log_axes(tmp_path):
    fig = plot.make_figure([write_run(tmp_path / "a")], log_scale=True)
    assert [ax.get_yscale() for ax in fig.axes] == ["log", "log", "log", "linear"]
    assert [ax.get_yscale() for ax in plot.make_figure([tmp_path / "a"]).axes] == ["linear"] * 4


def _cli(argv, capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: plot.main([str(a) for a in argv]))
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.mark.parametrize("suffix", [".pt", ".txt", ".png2"])
def test_an_unknown_out_suffix_is_one_line_before_anything_is_written(tmp_path, capsys, suffix):
    a = write_run(tmp_path / "a")
    code, out, err = _cli([a, "--out", tmp_path / f"x{suffix}"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"cannot write '{suffix}' files" in err, err
    assert ".png" in err and "Traceback" not in err and not (tmp_path / f"x{suffix}").exists()


def test_a_folder_or_a_name_without_suffix_prints_the_file_actually_written(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    folder = tmp_path / "figs"
    folder.mkdir()
    code, out, _ = _cli([a, "--out", folder], capsys)
    assert code == 0 and out.strip() == str(folder / "curves.png") and (folder / "curves.png").is_file()
    code, out, _ = _cli([a, "--out", tmp_path / "curves"], capsys)
    assert code == 0 and out.strip() == str(tmp_path / "curves.png") and (tmp_path / "curves.png").is_file()
    code, out, _ = _cli([a, "--out", tmp_path / "c.svg"], capsys)
    assert code == 0 and (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")


def test_a_non_utf8_line_is_skipped_with_a_note(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    with open(a / "metrics.jsonl", "ab") as f:
        f.write(b'{"iter": 7, "train/loss": 1.0, "no\xfft": 1}\n{"iter": 8, "train/loss": 0.9}\n')
    assert list(plot.read_metrics(a)["iter"]) == [1, 2, 3, 4, 5, 6, 8]
    err = capsys.readouterr().err
    assert err.strip() == f"note: {a / 'metrics.jsonl'} line 7 is damaged (not UTF-8); skipped"


def test_matplotlib_is_a_runtime_requirement():
    runtime = (ROOT / "requirements.txt").read_text().splitlines()
    assert any(line.startswith("matplotlib") for line in runtime)


def test_help_describes_the_plot_in_whole_sentences(capsys):
    """Before: --help's description was the docstring's first line, which stops at '...val bits per byte,
    and'. It is the first paragraph now, ending where its sentence ends."""
    from training.plot import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "val bits per byte, and the learning rate" in text and "(four titled panels)." in text, text


# ------------------------------------------------------------------ any JSON value in a plotted key

import numpy as np  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

# every kind of JSON value: the numbers that plot, and the ones that do not (bool, a string that reads as a
# number, an int past float's range, NaN/Infinity, which json accepts), and containers of them
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from([10**400, -10**400, 2**53 + 1])
    | st.floats() | st.text(max_size=8) | st.sampled_from(["1.5", "2", " 3 ", "nan", "abc", ""]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=5)
PLOTTED = ["iter", "tokens_seen", "train/loss", "val/loss", "val/bpb", "lr"]


def _plottable(key, value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (key == "iter" and not isinstance(value, int)):
        return False
    try:
        return abs(float(value)) != float("inf") and value == value
    except OverflowError:
        return False


@settings(max_examples=6)  # each draws a figure
@given(changes=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(PLOTTED), JSON_VALUES), min_size=1, max_size=6),
       log_scale=st.booleans(), with_bpb=st.booleans())
def test_only_real_numbers_are_plotted_and_every_other_value_is_a_note_naming_file_line_and_key(
        changes, log_scale, with_bpb, tmp_path_factory, capsys):
    """Before: a dict value was a matplotlib traceback and a string was drawn as a category label (the loss
    axis read 2.0, abc, 1.5); a panel never logged showed an empty legend instead of "not logged"."""
    capsys.readouterr()  # (what an earlier example's make_figure noted)
    run = tmp_path_factory.mktemp("run")
    records = [{"iter": i, "train/loss": 5.0 - i / 2, "lr": 1e-3, "tokens_seen": 100 * i} for i in range(1, 7)]
    for r in records[::3]:
        r.update({"val/loss": r["train/loss"] + 0.1, **({"val/bpb": 1.0} if with_bpb else {})})
    for line, key, value in changes:
        records[line][key] = value
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    path = run / "metrics.jsonl"
    code, out, err = _cli([run, "--out", run / "c.png"] + (["--log-scale"] if log_scale else []), capsys)
    kept = [r for r in records if _plottable("iter", r["iter"])]
    expected = {(k, i): r[k] for r in kept for i in [r["iter"]] for k in PLOTTED[2:] if _plottable(k, r.get(k))}
    if not any(k in ("train/loss", "val/loss") for k, _ in expected):
        assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"error: {path} has no train or val loss")
        return
    assert code == 0 and out.strip() == str(run / "c.png") and "Traceback" not in err, err
    for key in PLOTTED:  # each key with a non-number: one note naming the file, the first such line and the key
        bad = [n for n, r in enumerate(records, 1)
               if key in r and not (_plottable(key, r[key]) or (r[key] is None and key != "iter"))]
        assert (f"note: {path} line {bad[0]}: {key} is " in err) if bad else f": {key} is " not in err, (key, err)
    assert all(line.startswith("note: ") for line in err.splitlines()), err
    fig = plot.make_figure([run], log_scale=log_scale)
    loss_step, _, bpb, lr = fig.axes
    for ax in fig.axes:  # every point drawn is a number the file holds at that step
        for drawn in ax.lines:
            assert np.asarray(drawn.get_ydata()).dtype.kind in "iuf", drawn.get_ydata()  # no strings, no objects
    train = [(i, v) for (k, i), v in sorted(expected.items()) if k == "train/loss"]
    drawn = list(zip(loss_step.lines[0].get_xdata(), loss_step.lines[0].get_ydata())) if train else []
    # (doubles, as matplotlib draws them: a step past 2**53, such as 2**53 + 1, is held at its nearest double)
    assert [(float(i), float(v)) for i, v in train] == [(float(x), float(y)) for x, y in drawn]
    if not any(k == "val/bpb" for k, _ in expected):  # no line, so the panel says so instead of an empty legend
        assert not bpb.lines and bpb.get_legend() is None and [t.get_text() for t in bpb.texts] == ["not logged"]


# ------------------------------------------------------------------ --out naming a folder

@settings(max_examples=12, deadline=None)  # each draws a figure
@given(name=st.text("abcXYZ019_-", min_size=1, max_size=8), suffix=st.sampled_from(["", ".png", ".svg", ".d"]),
       depth=st.integers(1, 2), slash=st.booleans(), exists=st.booleans())
def test_out_ending_in_a_separator_is_a_folder_that_gets_curves_png(name, suffix, depth, slash, exists,
                                                                     tmp_path_factory, capsys):
    """Before: `--out figs/` with no figs/ yet wrote ./figs.png (argparse's Path dropped the slash), though
    the docs promise figs/curves.png. The reference: a name ending in / or naming a folder is a folder, made
    when missing, with curves.png inside; otherwise a name without a suffix gets .png. (Where the file goes is
    the question, not what it shows: the figure is a blank inch, written by the command's own writer.)"""
    from unittest import mock

    from eval.drawing import new_figure

    capsys.readouterr()
    root = tmp_path_factory.mktemp("out")
    run = write_run(root / "run")
    folder = root.joinpath(*[name + suffix] * depth)
    if exists:
        folder.mkdir(parents=True)
    with mock.patch.object(plot, "make_figure", lambda runs, **kwargs: new_figure((1, 1))):
        code, out, err = _cli([run, "--out", str(folder) + ("/" if slash else "")], capsys)
    if slash or exists:
        expected = folder / "curves.png"
    elif suffix in ("", ".d"):
        expected = folder.with_name(folder.name + ".png") if suffix == "" else None
    else:
        expected = folder
    if expected is None:  # '.d' is no format matplotlib writes: one line, nothing written
        assert code == 2 and "cannot write '.d' files" in err and not folder.exists(), err
        return
    assert code == 0 and out.strip() == str(expected), (out, err)
    assert expected.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" if expected.suffix == ".png" else expected.is_file()
    written = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.parent != run
                     and p.name != ownership.WRITTEN)  # (the record of what it wrote there: its own, hidden)
    assert written == [expected.relative_to(root)], written  # nothing beside it (no figs.png next to figs/)


def test_out_ending_in_a_separator_over_a_file_is_one_line(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    (tmp_path / "figs").write_text("a file, not a folder")
    code, out, err = _cli([run, "--out", str(tmp_path / "figs") + "/"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "names a folder, but" in err and "is a file" in err, err
    assert (tmp_path / "figs").read_text() == "a file, not a folder" and not (tmp_path / "figs.png").exists()


def test_a_long_metrics_file_is_read_a_line_at_a_time_keeping_only_the_plotted_numbers(tmp_path):
    """Memory in proportion to the numbers plotted, not to the file: lines padded with a field nobody plots (2 KB
    each) peak well under the file's size (read whole, split and parsed, a 1 GiB file took 7.4 GB)."""
    import tracemalloc

    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps({"iter": i, "train/loss": 5 - i / 1e4, "lr": 1e-3, "tokens_seen": 512 * i, "note": "x" * 2000})
             for i in range(1, 5001)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    size = (run / "metrics.jsonl").stat().st_size
    tracemalloc.start()
    try:
        records = plot.read_metrics(run)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(records["iter"]) == 5000 and peak < size / 4, (peak, size)
    xs, ys = plot.series(records, "train/loss", "iter")
    assert list(xs) == list(range(1, 5001)) and list(ys) == [5 - i / 1e4 for i in range(1, 5001)]  # the file's own


def test_the_plotted_numbers_take_8_bytes_each_not_a_python_float_in_a_tuple(tmp_path):
    """Before: each step was a tuple of Python floats (~250 bytes a step of 6 numbers): a 1 GiB metrics file, the
    most a run may log, took ~3.4 GB to plot. Now a column of doubles per plotted key: the peak of reading and
    taking one curve out is 8 bytes a number (the 6 columns, the curve's 2, one column's growth; +15% array
    slack) and a few lines, bounded by the count of numbers, not by the file."""
    import tracemalloc

    n = 20_000
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"iter": i, "train/loss": 5 - i / 1e5, "val/loss": 5.1 - i / 1e5, "val/bpb": 1.5,
                                        "lr": i / 1e9, "tokens_seen": 512 * i}) + "\n" for i in range(1, n + 1)))
    tracemalloc.start()
    try:
        xs, ys = plot.series(plot.read_metrics(path), "val/loss", "tokens_seen")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * n * (len(plot.KEYS) + 2 + 1) * 1.15 + (64 << 10), (peak, n)
    assert list(xs) == [512 * i for i in range(1, n + 1)] and list(ys) == [5.1 - i / 1e5 for i in range(1, n + 1)]


def test_running_out_of_memory_while_reading_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    a = write_run(tmp_path / "a")
    calls = []

    def loads(line):
        calls.append(line)
        if len(calls) == 4:
            raise MemoryError
        return json.loads(line)

    monkeypatch.setattr(plot, "json_loads", loads)
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: plot.main([str(a)]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "out of memory holding the numbers of its first 3 steps" in err and "Traceback" not in err, err


@pytest.mark.parametrize("bad, why", [(b"not json", "not JSON"), (b'{"iter": 7, "no\xfft": 1}', "not UTF-8"),
                                      (b'{"note": "' + b"x" * 300 + b'"}', "over 200 bytes")])
def test_a_damaged_line_is_skipped_with_one_note_as_a_resume_drops_it(bad, why, tmp_path, capsys, monkeypatch):
    """Damaged lines (not JSON, not UTF-8, longer than MAX_METRICS_LINE: here lowered to 200 bytes) are skipped
    with one note naming the first and counting the rest, as a resume drops them (before, one that was not JSON
    or too long refused the whole plot); a torn last line is skipped silently, and a BOM is no data."""
    monkeypatch.setattr(metrics, "MAX_METRICS_LINE", 200)  # (metrics_lines': the resume's bound, read alike)
    records = [b'{"iter": %d, "train/loss": %d.0}' % (i, 9 - i) for i in range(1, 6)]
    lines = [b"\xef\xbb\xbf" + records[0], records[1], bad, records[2], bad, records[3], records[4], b'{"iter": 6, "tra']
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join(lines))
    columns = plot.read_metrics(tmp_path)
    assert list(columns["iter"]) == [1, 2, 3, 4, 5] and list(columns["train/loss"]) == [8, 7, 6, 5, 4]
    note = capsys.readouterr().err.strip().splitlines()
    assert note == [f"note: {tmp_path / 'metrics.jsonl'} line 3 is damaged ({why}); skipped (and 1 more damaged line(s))"]
