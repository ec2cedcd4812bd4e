"""tests/warm_runs.py against the interpreter itself: the same small programs run both ways, `python ARGS`
fresh (subprocess, the reference) and forked from the warm interpreter, must give the same exit status,
stdout and stderr, in every way a program ends and reads its world that the suite's runs rely on."""
from __future__ import annotations

import os
import subprocess
import sys
import time
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


def test_argv0_path_and_main_are_a_fresh_interpreters(tmp_path):
    (tmp_path / "prog.py").write_text("import sys, os; print(sys.argv[0], sys.path == [os.path.dirname(__file__)] + "
                                      "[p for p in sys.path[1:]], __file__, sys.modules['__main__'].__name__)\n"
                                      "print([p for p in sys.path[1:]])")
    fresh, warm = both(["prog.py"], tmp_path)
    assert warm == fresh and fresh[0] == 0


def test_what_main_holds_is_destroyed_at_the_end_and_its_del_speaks(tmp_path):
    (tmp_path / "prog.py").write_text("import atexit\nclass T:\n    def __del__(self):\n        print('del ran', flush=True)"
                                      "\n        raise RuntimeError('in del')\nt = T()\natexit.register(print, 'atexit')")
    fresh, warm = both(["prog.py"], tmp_path)
    assert warm[:2] == fresh[:2] == (0, "atexit\ndel ran\n")
    assert warm[2].splitlines()[-1] == fresh[2].splitlines()[-1] == "RuntimeError: in del"


def test_a_function_defined_in_dash_c_pickles_by_its_main(tmp_path):
    code = "import pickle\ndef f(): pass\nprint(len(pickle.dumps(f)) > 0)"
    fresh, warm = both(["-c", code], tmp_path)
    assert warm == fresh == (0, "True\n", "")


def test_dash_m_of_a_package_whose_main_is_preloaded_says_nothing_of_it(tmp_path):
    fresh, warm = both(["-m", "checkpoint", "--help"], warm_runs.ROOT)
    assert warm == fresh and fresh[0] == 0 and fresh[2] == ""


def test_the_output_ends_when_every_process_holding_it_has_closed_it(tmp_path):
    # a child left holding stdout keeps subprocess.run waiting: a leftover worker is seen as a hang, not missed
    code = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(8)']); print('parent done')"
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=3)
    with pytest.raises(subprocess.TimeoutExpired):
        warm_runs.run(["-c", code], timeout=3)


def test_output_is_decoded_as_subprocess_decodes_it(tmp_path):
    code = "import sys; sys.stdout.buffer.write(b'a\\r\\nb\\rc\\n'); sys.stdout.flush()"
    fresh, warm = both(["-c", code], tmp_path)
    assert warm == fresh and fresh[1] == "a\nb\nc\n"
    bad = "import sys; sys.stdout.buffer.write(b'\\xff'); sys.stdout.flush()"
    with pytest.raises(UnicodeDecodeError):
        subprocess.run([sys.executable, "-c", bad], capture_output=True, text=True, timeout=60)
    with pytest.raises(UnicodeDecodeError):
        warm_runs.run(["-c", bad])


def test_each_run_draws_its_own_random_numbers_as_fresh_interpreters_do(tmp_path):
    code = "import random, numpy, torch; print(random.random(), numpy.random.randint(10**9), torch.rand(1).item())"
    fresh = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout for _ in "ab"]
    warm = [warm_runs.run(["-c", code]).stdout for _ in "ab"]
    assert fresh[0] != fresh[1]
    assert all(x != y for x, y in zip(*(w.split() for w in warm))), warm  # each of the three differs


def test_an_excepthook_the_program_installs_is_what_reports_its_exception(tmp_path):
    code = "import sys\nsys.excepthook = lambda *a: print('hook:', a[1], file=sys.stderr)\nraise ValueError('x')"
    fresh, warm = both(["-c", code], tmp_path)
    assert warm == fresh == (1, "", "hook: x\n")


def test_a_variable_read_when_an_interpreter_starts_is_refused_not_ignored(tmp_path):
    for name, value in (("PYTHONHASHSEED", "123"), ("PYTHONIOENCODING", "latin-1"), ("LC_ALL", "C"),
                        ("HF_HOME", str(tmp_path))):
        with pytest.raises(ValueError, match=name):
            warm_runs.run(["-c", "pass"], env={**os.environ, name: value})


def test_a_new_session_and_a_killed_run_are_as_asked(tmp_path):
    r = warm_runs.run(["-c", "import os; print(os.getsid(0) == os.getpid())"])
    assert r.stdout == "False\n"
    out = tmp_path / "out"
    p = warm_runs.Process(["-c", "import os; print(os.getsid(0) == os.getpid(), flush=True); import time; time.sleep(60)"],
                          stdout=out, start_new_session=True)
    try:
        deadline = time.time() + 30
        while not out.read_text() and time.time() < deadline:
            time.sleep(0.05)
        assert out.read_text() == "True\n"
    finally:
        p.kill()
    assert p.wait(30) == -9


def test_a_run_past_its_timeout_is_gone(tmp_path):
    pid = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        warm_runs.run(["-c", f"import os, time; open({str(pid)!r}, 'w').write(str(os.getpid())); time.sleep(60)"],
                      timeout=2)
    assert not Path(f"/proc/{pid.read_text()}").exists()


def test_the_fork_server_holds_no_module_whose_import_reads_a_variable_tests_set():
    # matplotlib reads MPLBACKEND when imported, wandb its settings: test_drawing and the wandb tests set them per run
    r = warm_runs.run(["-c", "import sys; print([m for m in ('matplotlib', 'wandb', 'datasets') if m in sys.modules])"])
    assert r.returncode == 0 and r.stdout == "[]\n", r


def test_a_variable_this_process_gained_after_the_server_started_passes_whichever_copy_a_test_holds(monkeypatch):
    # CI's rehearsal: lm_eval's import sets HF_XET_HIGH_PERFORMANCE in a test process whose fork server had started;
    # a module-level ENV copied before it and os.environ after it both run, a value the caller sets is refused
    assert warm_runs.run(["-c", "pass"]).returncode == 0  # (the server is started)
    before = dict(os.environ)
    monkeypatch.setenv("HF_XET_TEST_DRIFT", "1")
    assert warm_runs.run(["-c", "pass"], env=before).returncode == 0
    assert warm_runs.run(["-c", "pass"], env=dict(os.environ)).returncode == 0
    with pytest.raises(ValueError, match="HF_XET_TEST_DRIFT"):
        warm_runs.run(["-c", "pass"], env={**os.environ, "HF_XET_TEST_DRIFT": "2"})
