"""An entry point (train.py's main by default) in-process through run_cli -> (code, stdout, stderr), and the
checks that it ended with one `error:` line naming given words."""
from __future__ import annotations

import pytest
from training import cli as train_cli
from errors import run_cli


def cli(argv, capsys, main=train_cli.main):
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: main(argv))
    out, err = capsys.readouterr()
    return e.value.code, out, err


def one_error_line(code, err, *words) -> str:
    """The command failed (exit 2) and said so in one `error:` line holding `words`, and stderr holds nothing else:
    no traceback, no second line."""
    return _error_line(code, err, words, alone=True)


def an_error_line(code, err, *words) -> str:
    """As one_error_line, among other stderr lines (progress bars, notes) that are no error and no traceback."""
    return _error_line(code, err, words, alone=False)


def _error_line(code, err, words, alone: bool) -> str:
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err and (not alone or len(lines) == 1), (code, err)
    for w in words:
        assert w in errors[0], (w, errors[0])
    return errors[0]
