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
import locale
import multiprocessing
import multiprocessing.forkserver
import os
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]

# What a run of train.py, sample.py, chat.py, serve.py and the `-m` tools imports; torch._dynamo is imported by the
# optimizers' first step. Not matplotlib (it reads MPLBACKEND when imported) nor wandb (its tests set its
# variables before importing it). Last, warm_heap: what they made is frozen out of each run's collections.
_PRELOAD = ["torch", "torch._dynamo", "transformers", "training.cli", "inference.sample_cli", "inference.chat_cli",
            "checkpoint.export", "checkpoint.__main__", "data.prepare", "eval.hellaswag", "eval.inspect",
            "benchmarks.cli", "server.cli", "faults", "warm_runs", "warm_heap"]
_forkserver = None
_server_env: dict[str, str] = {}  # the variables read at start (_read_at_start) the fork server started with
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
    _server_env.update((k, v) for k, v in os.environ.items() if _read_at_start(k))
    path = [str(ROOT / "tests"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    cwd = os.getcwd()
    with mock.patch.dict(os.environ, PYTHONPATH=os.pathsep.join(path)):
        os.chdir(ROOT)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            os.chdir(cwd)
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


class _Fd:
    """A file descriptor handed to the forked process (multiprocessing passes it over the fork server's
    socket, as it passes a Connection): the child's end of a real pipe, so that the reader of its output
    sees the end when the last process holding the write end closes it, as subprocess's pipes do."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return _inherited, (reduction.DupFd(self.fd),)


def _inherited(dup) -> int:
    return dup.detach()


def _read_at_start(key: str) -> bool:
    """The variables an interpreter (or a preloaded module: transformers' HF_HOME) reads when it starts, which
    a forked one cannot take (PYTHONPATH and PYTHONUNBUFFERED it takes, below)."""
    return (key.startswith(("PYTHON", "LC_", "HF_", "TRANSFORMERS_")) or key in ("LANG", "LANGUAGE")) and \
        key not in ("PYTHONPATH", "PYTHONUNBUFFERED")


def _become(args: list[str], env: dict[str, str], cwd: str, streams: tuple, new_session: bool) -> None:
    """In the forked process: become `python ARGS` run with `env` in `cwd`, its stdin/stdout/stderr the pipes
    handed over or the files named (opened as a shell's < and >> would), and end as that interpreter ends."""
    import atexit
    import builtins
    import gc
    import runpy
    import signal
    import types

    for fd, stream in enumerate(streams):  # first: whatever fails next is told on the run's own stderr
        f = stream if isinstance(stream, int) else os.open(stream, os.O_RDONLY if fd == 0 else
                                                           os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(f, fd)
        os.close(f)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = sys.__stdin__ = _stream(0, sys.__stdin__, False, "r")
    sys.stdout = sys.__stdout__ = _stream(1, sys.__stdout__, unbuffered, "w")
    sys.stderr = sys.__stderr__ = _stream(2, sys.__stderr__, unbuffered, "w")
    if new_session:  # as start_new_session=True: a killpg reaches what it starts too
        os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    import torch

    # a fresh interpreter's torch: threads from OMP_NUM_THREADS, else one per CPU it may run on; a seed of its
    # own (Python's random is reseeded at every fork by Python itself; numpy's is not)
    threads = env.get("OMP_NUM_THREADS", "").strip()
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) else len(os.sched_getaffinity(0)))
    torch.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    # sys.path as Python makes it: the script's folder ('' for -c, the working directory for -m), PYTHONPATH,
    # then the installation's own (the modules preloaded stay imported from where the fork server found them)
    installed = [p for p in sys.path if p.startswith((sys.base_prefix, sys.prefix))]
    given = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    script = str(Path(cwd) / args[0]) if args[0] not in ("-c", "-m") else ""
    first = "" if args[0] == "-c" else cwd if args[0] == "-m" else str(Path(script).resolve().parent)
    sys.path[:] = [first, *given, *installed]
    main = types.ModuleType("__main__")  # a __main__ of its own, cleared at the end as the interpreter clears it
    main.__dict__.update(__builtins__=builtins, __spec__=None, __loader__=None)
    sys.modules["__main__"] = main
    code = 0
    try:
        if args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        elif args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            # preloaded: run as if never imported, as Python would (a package stays: its __main__ is what runs)
            if not hasattr(sys.modules.get(args[1]), "__path__"):
                sys.modules.pop(args[1], None)
            sys.modules.pop(args[1] + ".__main__", None)
            runpy._run_module_as_main(args[1])  # what `python -m` itself calls: argv[0] becomes the file
        else:
            sys.argv = list(args)
            try:
                source = Path(script).read_bytes()
            except OSError as e:
                print(f"{sys.executable}: can't open file {script!r}: [Errno {e.errno}] {e.strerror}", file=sys.stderr)
                raise SystemExit(2) from None
            main.__file__ = script  # (absolute, as since Python 3.9)
            exec(compile(source, script, "exec"), main.__dict__)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException as e:  # noqa: BLE001 (the interpreter's own last resort)
        tb = e.__traceback__  # from the program's own frames, as the interpreter shows it
        while tb and tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)  # (a program may have put its own: wandb does)
        # Python re-raises an uncaught Ctrl-C as the signal itself
        code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    threading._shutdown()  # as the interpreter's exit: wait for non-daemon threads, then atexit, then flush
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError) as e:  # the interpreter's words for it, then its status
            code = code or 120
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"Exception ignored in: {stream!r}\n{type(e).__name__}: {e}\n")
                sys.stderr.flush()
    main.__dict__.clear()  # then __main__'s objects go: their __del__ runs and says what it says
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


class Process:
    """`python ARGS` forked from the warm interpreter, with Popen's pid, poll, wait, communicate,
    send_signal, terminate, kill and returncode (negative: the signal that ended it). stdin, stdout and
    stderr are each a file's path or subprocess.PIPE (a real pipe; communicate() writes and reads them as
    Popen's does); for a path, communicate() reads the file back once the process has ended."""

    def __init__(self, args: list, *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
                 stdin: str | Path | int = os.devnull, stdout: str | Path | int = os.devnull,
                 stderr: str | Path | int = os.devnull, start_new_session: bool = False, text: bool = True):
        self.args = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args]  # bytes: as a shell gives them
        env = dict(os.environ if env is None else env)
        cwd = str(cwd or os.getcwd())
        if not Path(cwd).is_dir():  # as Popen: raised here, not a run that fails somewhere unseen
            raise FileNotFoundError(f"[Errno 2] No such file or directory: {cwd!r}")
        context = _context()
        # a value the fork server started with is what its preloads read; one this process's environment has
        # gained since by its own imports (lm_eval's sets HF_XET_HIGH_PERFORMANCE) is let through; any other is
        # what the caller sets for this run, which a forked run cannot take
        differ = sorted(k for k in {*env, *os.environ, *_server_env} if _read_at_start(k) and
                        env.get(k) != _server_env.get(k) and env.get(k) != os.environ.get(k))
        if differ:
            raise ValueError(f"warm_runs: {differ} differ from the fork server's environment, and are read when an "
                             "interpreter starts: start this run fresh (subprocess with sys.executable)")
        self._text, self.stdin, self.stdout, self.stderr = text, None, None, None
        self._files, ends, mine = [], [], []
        for fd, stream in enumerate((stdin, stdout, stderr)):
            if stream == subprocess.PIPE:
                r, w = os.pipe()
                child, parent = (r, w) if fd == 0 else (w, r)
                ends.append(_Fd(child))
                mine.append(child)
                setattr(self, ("stdin", "stdout", "stderr")[fd], open(parent, "wb" if fd == 0 else "rb"))
                self._files.append(None)
            else:
                if fd and (Path(stream).is_file() or not Path(stream).exists()):
                    Path(stream).write_bytes(b"")
                ends.append(str(stream))
                self._files.append(str(stream))
        try:
            self._process = context.Process(target=_become, args=(self.args, env, cwd, tuple(ends), start_new_session))
            self._process.start()
        finally:
            for fd in mine:  # the child's ends: only the child holds them now
                os.close(fd)
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

    def communicate(self, input: bytes | None = None, timeout: float | None = None) -> tuple:
        """(stdout, stderr) once the process has ended and its pipes are closed by every process holding
        them (a child it left holding one keeps this waiting, as with Popen), text decoded as subprocess
        decodes it (strictly, newlines translated)."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        got: dict[int, bytes] = {}

        def read(fd: int, f) -> None:
            got[fd] = f.read()
            f.close()

        def write(f) -> None:
            with contextlib.suppress(BrokenPipeError):
                f.write(input or b"")
            with contextlib.suppress(BrokenPipeError):
                f.close()

        threads = [threading.Thread(target=read, args=(fd, f), daemon=True)
                   for fd, f in ((1, self.stdout), (2, self.stderr)) if f is not None]
        threads += [threading.Thread(target=write, args=(self.stdin,), daemon=True)] if self.stdin else []
        for t in threads:
            t.start()
        for t in threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        out = [got.get(fd, b"") if self._files[fd] is None else
               Path(self._files[fd]).read_bytes() if Path(self._files[fd]).is_file() else b"" for fd in (1, 2)]
        if not self._text:
            return tuple(out)
        encoding = locale.getpreferredencoding(False)
        return tuple(o.decode(encoding).replace("\r\n", "\n").replace("\r", "\n") for o in out)

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
    through pipes (stdout into the file `stdout` instead, when named), stdin from `input`, the file `stdin`,
    or /dev/null; a run past `timeout` is killed and raises TimeoutExpired."""
    if input is not None:
        stdin = subprocess.PIPE
        input = input.encode(locale.getpreferredencoding(False)) if isinstance(input, str) else input
    p = Process(args, env=env, cwd=cwd, stdin=stdin or os.devnull, stdout=stdout or subprocess.PIPE,
                stderr=subprocess.PIPE, text=text)
    try:
        out, err = p.communicate(input, timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(30)
        raise
    return subprocess.CompletedProcess(p.args, p.returncode, "" if stdout else out, err)
