"""tests/matrix.py's rows, without training anything: every two values of two factors meet in a row
that runs (or, for a combination that must be refused, in its refusal row), and the constraints hold."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import matrix
from errors import UserError

ROOT = Path(__file__).resolve().parents[1]

SEEDS = range(5)


def every_pair() -> list[tuple[str, str, str, str]]:
    """All (factor a, value, factor b, value) with a before b, from the factor table alone."""
    names = list(matrix.FACTORS)
    return [(a, va, b, vb) for i, a in enumerate(names) for b in names[i + 1:]
            for va in matrix.FACTORS[a] for vb in matrix.FACTORS[b]]


def graph_without_its_needs(row: dict[str, str]) -> bool:
    # written out here too: the graphed step runs on one process, a fixed micro-batch, no compile, no activation
    # checkpointing and no conversations; graph on beside anything else is the plain run, and no row asks for it
    needs = {"ranks": "1", "batch": "4", "compile": "off", "ackpt": "off", "sft": "off"}
    return row.get("graph") == "on" and any(row.get(f, v) != v for f, v in needs.items())


def must_refuse(row: dict[str, str]) -> bool:
    # written out here, not read from matrix.refusal: HellaSwag's prose can't be encoded by a char vocabulary
    return row["hswag"] == "on" and row["tok"] == "char"


@pytest.mark.parametrize("seed", SEEDS)
def test_every_pair_of_values_meets_in_a_row_that_runs_or_in_its_refusal_row(seed):
    rows = matrix.rows(seed)
    running = [r for r in rows if not must_refuse(r)]
    refused = [r for r in rows if must_refuse(r)]
    missing = []
    assert not any(graph_without_its_needs(r) for r in rows)
    for a, va, b, vb in every_pair():
        if graph_without_its_needs({a: va, b: vb}):
            continue
        pair_refused = (a, va, b, vb) == ("hswag", "on", "tok", "char")
        pool = refused if pair_refused else running
        if not any(r[a] == va and r[b] == vb for r in pool):
            missing.append((a, va, b, vb))
    assert not missing, missing
    assert len(rows) <= 16  # the matrix's time budget in CI: ~30 s a row on 2 cores, 2 rows at once


def test_the_pair_count_is_the_hand_computed_one():
    # ranks and tok have 3 values, the other 13 factors 2: C(13,2)*4 + 13*2*(3+3) + 3*3 = 312 + 156 + 9
    assert len(every_pair()) == 312 + 156 + 9
    # of which no row holds graph on beside ddp2, fsdp2, batch auto, compile on, ackpt on or sft on
    assert sum(graph_without_its_needs({a: va, b: vb}) for a, va, b, vb in every_pair()) == 6


@pytest.mark.parametrize("seed", SEEDS)
def test_rows_hold_the_constraints_and_refusal_rows_say_why(seed):
    for row in matrix.rows(seed):
        assert list(row) == list(matrix.FACTORS)
        assert all(row[f] in values for f, values in matrix.FACTORS.items()), row
        expected = matrix.refusal(row)
        assert (expected is not None) == must_refuse(row), row
        if expected is not None:  # only the refused pair differs from the defaults: nothing else is exercised
            others = {f: v for f, v in row.items() if f not in ("hswag", "tok")}
            assert others == {f: values[0] for f, values in matrix.FACTORS.items() if f not in ("hswag", "tok")}


def test_the_rows_and_the_stop_steps_are_the_same_for_a_seed():
    assert matrix.rows(0) == matrix.rows(0)
    assert matrix.rows(0) != matrix.rows(1)


def test_bf16_collapses_to_float32_where_the_cpu_has_no_native_bf16(tmp_path: Path):
    row = next(r for r in matrix.rows(0) if r["dtype"] == "bf16")
    assert "--train.dtype=bfloat16" in matrix.row_args(row, tmp_path, native_bf16=True)
    assert "--train.dtype=float32" in matrix.row_args(row, tmp_path, native_bf16=False)


def test_each_factor_value_reaches_the_command_line(tmp_path: Path):
    """A factor that changed nothing on the command line would cover its pairs in name only."""
    for factor, values in matrix.FACTORS.items():
        for value in values:
            row = next(r for r in matrix.rows(0) if r[factor] == value and not must_refuse(r))
            other = {**row, factor: next(v for v in values if v != value)}
            if must_refuse(other):
                continue
            assert ((matrix.row_args(row, tmp_path, True), matrix.processes(row))
                    != (matrix.row_args(other, tmp_path, True), matrix.processes(other))), (factor, value)


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


@settings(max_examples=8)  # each computes the pairwise rows
@example(rows="99", jobs="1").via("a K past the rows: it was every row")
@example(rows="", jobs="1").via("an empty --rows: it was every row")
@given(rows=st.one_of(st.integers(-3, 30).map(str), st.text(alphabet="0123456789-, x", max_size=6), st.just(",")),
       jobs=st.one_of(st.integers(-3, 3).map(str), st.sampled_from(["", "x", "1.5", "+2"])))
def test_rows_and_jobs_below_1_or_not_numbers_are_refused_in_one_line(capsys, rows, jobs):
    """Before: --rows 0 and --rows , crashed in print_table (TypeError: 'int' object is not iterable),
    --rows -1 quietly meant every row but the last, --rows '' and a K past the last row every row, and --jobs
    0 or -2 quietly ran 1 at a time. Now a value below 1, past the rows or not a number is one UserError
    (run_cli's `error:` line), a K past the rows naming their range; anything else lists rows."""
    count = len(matrix.rows(0))
    try:
        matrix.main(["--list", f"--rows={rows}", f"--jobs={jobs}"])
    except UserError as e:
        assert "\n" not in str(e) and ("--rows" in str(e) or "--jobs" in str(e)), e
        if "--rows" in str(e) and (_int(rows) or 0) > count:
            assert f"from 1 to {count}" in str(e), e
        return
    finally:
        listed = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[1:-1]]
    assert (_int(jobs) or 0) >= 1, jobs
    numbers = [int(n) for n in listed]
    assert numbers and all(1 <= n <= count for n in numbers), (rows, listed)
    if "," not in rows:
        assert 1 <= _int(rows) <= count and numbers == list(range(1, _int(rows) + 1)), (rows, listed)


def test_matrix_py_prints_one_error_line_for_no_rows():
    out = subprocess.run([sys.executable, "tests/matrix.py", "--list", "--rows", "0"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("error: --rows '0' names no row") and out.stderr.count("\n") == 1
