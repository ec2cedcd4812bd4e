"""tests/warm_runs.py against the interpreter itself: the same small programs run both ways, `python ARGS`
fresh (subprocess, the reference) and forked from the warm interpreter, must give the same exit status,
stdout and stderr, in every way a program ends and reads its world that the suite's runs rely on."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import warm_runs

SCRIPT = r'''
import atexit, os, signal, sys, threading, time
how = sys.argv[1]
print("argv", sys.argv[1:], "path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)), "cwd", os.getcwd())
print("env", os.environ.get("WARM_TEST"), "name", __name__, "stdin", repr(sys.stdin.read()))
print("streams", [(s.name, s.encoding, s.errors, s.line_buffering, s.write_through) for s in (sys.stdout, sys.stderr)])
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined", flush=True))).start()
sys.stderr.write("to stderr \udcff\n")
if how == "exit3":
    sys.exit(3)
if how == "exit_text":
    sys.exit("a message")
if how == "raise":
    raise ValueError("boom")
if how == "kill":
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
if how == "ctrl_c":
    raise KeyboardInterrupt
if how == "big_exit":
    sys.exit(300)
'''


def both(args: list, tmp_path: Path, unbuffered: str = "", **kw) -> tuple[tuple, tuple]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"WARM_TEST": "value"}
    env |= {"PYTHONUNBUFFERED": "1"} if unbuffered else {}
    fresh = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=60, **kw)
    warm = warm_runs.run(args, env=env, cwd=tmp_path, **kw)
    shown = lambda r: (r.returncode, r.stdout, r.stderr.replace(str(warm_runs.ROOT / "tests"), "<tests>"))  # noqa: E731
    return shown(fresh), shown(warm)


@pytest.mark.parametrize("unbuffered", ["", "1"])
@pytest.mark.parametrize("how", ["end", "exit3", "exit_text", "kill", "ctrl_c", "big_exit"])
def test_a_script_ends_as_it_ends_in_a_fresh_interpreter(how, unbuffered, tmp_path):
    (tmp_path / "prog.py").write_text(SCRIPT)
    fresh, warm = both(["prog.py", how, "ünï"], tmp_path, unbuffered, input="piped in\n")
    assert warm == fresh


def test_an_uncaught_exception_is_a_traceback_and_status_1(tmp_path):
    (tmp_path / "prog.py").write_text(SCRIPT)
    fresh, warm = both(["prog.py", "raise"], tmp_path)
    assert warm == fresh and fresh[0] == 1 and fresh[2].splitlines()[-1] == "ValueError: boom"  # (frames too)


def test_dash_c_and_dash_m_run_as_main_with_their_argv_and_path(tmp_path):
    code = "import sys, os; print(__name__, sys.argv, repr(sys.path[0]), os.environ['WARM_TEST'])"
    fresh, warm = both(["-c", code, "a", "b"], tmp_path)
    assert warm == fresh and fresh[0] == 0
    (tmp_path / "mod_here.py").write_text("import sys; print(__name__, sys.argv[1:], sys.path[0] == __import__('os')"
                                          ".getcwd()); raise SystemExit(4)")
    fresh, warm = both(["-m", "mod_here", "x"], tmp_path)
    assert warm[:2] == fresh[:2] and fresh[:2] == (4, "__main__ ['x'] True\n")


def test_a_preloaded_module_run_with_dash_m_is_run_fresh_without_runpys_warning(tmp_path):
    # eval.hellaswag is imported by the fork server: -m must still run it as __main__, and say nothing of it
    fresh, warm = both(["-m", "eval.hellaswag", "--help"], warm_runs.ROOT)
    assert warm == fresh and fresh[0] == 0 and fresh[2] == ""


@pytest.mark.parametrize("size", [10, 100000])  # flushed at the exit, or while printing
@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_stdout_to_a_full_device_fails_as_a_fresh_interpreter_fails(size, unbuffered, tmp_path):
    (tmp_path / "prog.py").write_text(f"print('x' * {size})")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | ({"PYTHONUNBUFFERED": "1"} if unbuffered else {})
    with open("/dev/full", "w") as full:
        fresh = subprocess.run([sys.executable, str(tmp_path / "prog.py")], stdout=full, stderr=subprocess.PIPE,
                               text=True, env=env, timeout=60)
    warm = warm_runs.run([tmp_path / "prog.py"], stdout="/dev/full", env=env)
    assert warm.returncode == fresh.returncode and fresh.returncode in (1, 120)
    assert warm.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1], (warm.stderr, fresh.stderr)
    assert warm.stderr.splitlines()[0] == fresh.stderr.splitlines()[0], (warm.stderr, fresh.stderr)


def test_a_run_past_its_timeout_is_killed_and_raises(tmp_path):
    (tmp_path / "prog.py").write_text("import time; time.sleep(60)")
    with pytest.raises(subprocess.TimeoutExpired):
        warm_runs.run([tmp_path / "prog.py"], timeout=1)
