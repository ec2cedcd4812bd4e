"""Commands run as processes forked from a warm interpreter: `python ARGS` without the 3-5 s of CPU a fresh
interpreter spends importing torch, torch._dynamo and this project, once for each run of each test.

    run(["train.py", *args], env=..., cwd=..., input=..., timeout=...)  -> subprocess.CompletedProcess
    Process(["tests/faults.py", *args], env=..., stdout=path, stderr=path)  # Popen's pid, poll, wait, signals

ARGS are what follows `python`: a script's path (relative to `cwd`, as the shell would give it), `-m MODULE`
or `-c CODE`, then its arguments. Each run is its own process (own pid, environment, working directory,
stdin, stdout and stderr, signals and exit status: negative for the signal that ended it), forked from a
fork server that imported torch and the entry points' modules once per test process (multiprocessing's
forkserver), as torch's own distributed tests fork theirs. In it the command runs as Python would run it:
`sys.argv`, `sys.path[0]`, `__main__`, SystemExit's code, an uncaught exception's traceback and status 1,
threads joined and atexit handlers run at the end, stdout flushed (a failed flush: status 120), each
checked against a fresh interpreter by tests/test_warm_runs.py.

What differs from a fresh interpreter, so tests of these stay on `subprocess` with `sys.executable`:
the modules in _PRELOAD are imported before the environment is set (a variable read at import time, a
module hidden by PYTHONPATH, glibc's MALLOC_ variables), Ctrl-C during start-up, a terminal as stdin, a
child of a process of the test's own (orphaned when its parent dies), and what `sys.modules` holds.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What a run of train.py, sample.py, chat.py, serve.py and the `-m` tools imports; torch._dynamo is imported by the
# optimizers' first step. Not matplotlib (it reads MPLBACKEND when imported) nor wandb (its tests set its
# variables before importing it).
_PRELOAD = ["torch", "torch._dynamo", "transformers", "training.cli", "inference.sample_cli", "inference.chat_cli",
            "checkpoint.export", "checkpoint.__main__", "data.prepare", "eval.hellaswag", "eval.inspect",
            "benchmarks.cli", "server.cli", "faults", "warm_runs"]
_forkserver = None
_starting = threading.Lock()


def _context():
    global _forkserver
    with _starting:  # (tests/matrix.py starts runs from several threads)
        if _forkserver is None:
            _forkserver = _started()
    return _forkserver


def _started():
    """The fork server, started. Python 3.11's ignores the sys.path it is handed and imports _PRELOAD with
    its own, made from its working directory and PYTHONPATH: started from a test's folder that holds a
    data/ of its own, `data` was that folder. So it starts from the root, with the root and tests/ on its path."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    cwd, path = os.getcwd(), os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT), *([path] if path else [])])
    os.chdir(ROOT)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.chdir(cwd)
        if path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = path
    return context


def _stream(fd: int, like, unbuffered: bool, mode: str):
    """A std stream on `fd` as a fresh interpreter makes it (`like`: this interpreter's own, made at its
    start-up under the same locale): its encoding and errors, its name; with -u or PYTHONUNBUFFERED, no
    buffer and write-through, else stderr line-buffered."""
    import io

    raw = open(fd, mode + "b", buffering=0 if unbuffered and mode == "w" else -1, closefd=False)
    (raw if unbuffered and mode == "w" else raw.raw).name = ("<stdin>", "<stdout>", "<stderr>")[fd]
    encoding, errors = (like.encoding, like.errors) if like else ("utf-8", "backslashreplace" if fd == 2 else "strict")
    stream = io.TextIOWrapper(raw, encoding=encoding, errors=errors, line_buffering=fd == 2 and not unbuffered,
                              write_through=unbuffered and mode == "w")
    stream.mode = mode
    return stream


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def _become(args: list[str], env: dict[str, str], cwd: str, files: tuple[str, str, str], new_session: bool) -> None:
    """In the forked process: become `python ARGS` run with `env` in `cwd`, its stdin/stdout/stderr the
    files named (opened as a shell's < and >> would), and exit as that interpreter would."""
    import atexit
    import runpy
    import signal
    import threading
    import traceback

    if new_session:  # as start_new_session=True: a killpg reaches what it starts too
        os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in enumerate(files):
        f = os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(f, fd)
        os.close(f)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = sys.__stdin__ = _stream(0, sys.__stdin__, False, "r")
    sys.stdout = sys.__stdout__ = _stream(1, sys.__stdout__, unbuffered, "w")
    sys.stderr = sys.__stderr__ = _stream(2, sys.__stderr__, unbuffered, "w")
    import torch

    # a fresh interpreter's torch takes its threads from OMP_NUM_THREADS, else one per core
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", 0)) or os.cpu_count() or 1)
    # sys.path as Python makes it: the script's folder ('' for -c, the working directory for -m), PYTHONPATH,
    # then the installation's own (the modules preloaded stay imported from where the fork server found them)
    installed = [p for p in sys.path if p.startswith((sys.base_prefix, sys.prefix))]
    given = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = "" if args[0] == "-c" else cwd if args[0] == "-m" else str((Path(cwd) / args[0]).resolve().parent)
    sys.path[:] = [first, *given, *installed]
    code = 0
    try:
        if args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        elif args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.modules.pop(args[1], None)  # preloaded: run as __main__ as if never imported, as Python would
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            runpy.run_path(str(Path(cwd) / args[0]), run_name="__main__")  # (__main__'s __file__ is absolute)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException as e:  # noqa: BLE001 (the interpreter's own last resort)
        tb = e.__traceback__  # from the program's own frames, as the interpreter prints it
        while tb and tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        # Python re-raises an uncaught Ctrl-C as the signal itself
        code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    threading._shutdown()  # as the interpreter's exit: wait for non-daemon threads, then atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError) as e:  # the interpreter's words for it, then its status
            code = code or 120
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"Exception ignored in: {stream!r}\n{type(e).__name__}: {e}\n")
                sys.stderr.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


class Process:
    """`python ARGS` forked from the warm interpreter, with Popen's pid, poll, wait, communicate,
    send_signal, terminate, kill and returncode (negative: the signal that ended it). Its output goes to
    the files named; communicate() reads them back once it has ended."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
                 stdin: str | Path = os.devnull, stdout: str | Path = os.devnull, stderr: str | Path = os.devnull,
                 start_new_session: bool = False, text: bool = True):
        self.args = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args]  # bytes: as a shell gives them
        self._text, self._files = text, (str(stdin), str(stdout), str(stderr))
        for path in (stdout, stderr):
            if Path(path).is_file() or not Path(path).exists():
                Path(path).write_bytes(b"")
        self._process = _context().Process(
            target=_become, args=(self.args, dict(os.environ if env is None else env), str(cwd or os.getcwd()),
                                  self._files, start_new_session))
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple:
        self.wait(timeout)
        out = [Path(p).read_bytes() if Path(p).is_file() else b"" for p in self._files[1:]]
        return tuple(o.decode(errors="replace") for o in out) if self._text else tuple(out)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)


def run(args: list, *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
        input: str | bytes | None = None, stdin: str | Path | None = None, stdout: str | Path | None = None,
        timeout: float = 300, text: bool = True) -> subprocess.CompletedProcess:
    """As subprocess.run([sys.executable, *args], capture_output=True, ...): stdout and stderr captured
    (stdout to the file `stdout` instead, when named), stdin from `input` or the file `stdin`; a run past
    `timeout` is killed and raises TimeoutExpired."""
    with tempfile.TemporaryDirectory(prefix="warm-") as tmp:
        if input is not None:
            stdin = Path(tmp) / "stdin"
            stdin.write_bytes(input.encode() if isinstance(input, str) else input)
        out, err = stdout or Path(tmp) / "stdout", Path(tmp) / "stderr"
        p = Process(args, env=env, cwd=cwd, stdin=stdin or os.devnull, stdout=out, stderr=err, text=text)
        try:
            got_out, got_err = p.communicate(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(30)
            raise
    return subprocess.CompletedProcess(p.args, p.returncode, "" if stdout else got_out, got_err)
