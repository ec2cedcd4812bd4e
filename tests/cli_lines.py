"""An entry point (train.py's main by default) in-process through run_cli -> (code, stdout, stderr), and the
check that it ended with one `error:` line naming given words."""
from __future__ import annotations

import pytest
import train
from errors import run_cli


def cli(argv, capsys, main=train.main):
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: main(argv))
    out, err = capsys.readouterr()
    return e.value.code, out, err


def one_line(code, err, *words):
    assert code == 2 and "Traceback" not in err, err
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]
