"""SIGINT/SIGTERM/SIGHUP become a flag the training loop checks after each step (finish, checkpoint, exit 0).
A second signal stops at once with KeyboardInterrupt. SIGHUP is SIGTERM's twin: closing the terminal (or
an ssh session dropping) saves the work and says so in one line, where its default would kill the run with
no line and no final checkpoint.

A rank whose launcher died (`kill -9` of torchrun) would train on as an orphan: with `watch_parent` (set
by train.py when torchrun started it, TORCHELASTIC_RUN_ID) a thread watches the parent pid, and when it
changes (the parent is gone; the rank was re-parented to init or a subreaper) the process sends itself
SIGTERM: the same stop after the step, with a checkpoint, and the line names the launcher. A watch rather
than PR_SET_PDEATHSIG: the kernel sends that when the parent *thread* that forked the rank ends, which a
launcher spawning from a worker thread would do while alive, and it is Linux-only.

A rank that waits in a collective for another that stopped answering never gets back to the loop:
Python runs a signal's handler only between bytecodes, and the wait is inside torch.distributed. So the
signal is also written to a wakeup pipe (signal.set_wakeup_fd), which a watchdog thread reads: if the
main thread is then waiting in a collective (Parallel.waiting_in) and is still in the same one a grace
later (2 s; a step: 3 times its usual length; rank 0's long work: never), the process ends at once with
one line naming the collective and the step. Nothing saved is lost: every checkpoint file is complete or
absent (written to a temp, then renamed).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable

from errors import to_stderr

STUCK_EXIT = 3  # the exit code of a rank stopped while it waited
# the signals that stop a run after the step (SIGHUP where the platform has it)
STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)
PARENT_POLL_S = 0.5  # how often the parent watch looks: a launcher's death is said within this


def launched_by_torchrun() -> bool:
    """torchrun (torch.distributed.run) sets this in every worker it starts."""
    return "TORCHELASTIC_RUN_ID" in os.environ


class StopFlag:
    def __init__(self, par=None, saved: Callable[[], str] = lambda: "", *, watch_parent: bool = False) -> None:
        self.requested = False
        self.reason = ""
        self.par = par  # training.parallel.distributed.Parallel: what the main thread waits in, if anything
        self.saved = saved  # what is on disk, for the line (e.g. "out/ckpt.pt holds iter 40")
        self._previous: dict[int, object] = {}
        self._pipe: tuple[int, int] | None = None
        self._old_wakeup = -1
        self.watch_parent = watch_parent
        self._watching = False

    def request(self, reason: str) -> None:
        self.requested = True
        self.reason = self.reason or reason

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.request(signal.Signals(signum).name)

    def install(self) -> "StopFlag":
        if threading.current_thread() is not threading.main_thread():  # signal.signal only works there
            return self
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        if self.watch_parent:
            self._watching = True
            threading.Thread(target=self._watch_parent, args=(os.getppid(),), daemon=True, name="parent-watch").start()
        if self.par is not None and self.par.enabled:
            r, w = os.pipe()
            os.set_blocking(w, False)
            self._pipe = (r, w)
            self._old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            threading.Thread(target=self._watch, args=(r,), daemon=True, name="stop-watchdog").start()
        return self

    def _watch(self, r: int) -> None:
        """The watchdog: wakes on every signal; ends the process if the main thread is stuck in a wait."""
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                data = b""
            if not data:  # restore() closed the writing end
                os.close(r)
                return
            signum = data[-1]
            if signum not in STOP_SIGNALS:
                continue
            waiting = self.par.waiting_in
            if waiting is None:
                continue  # between collectives: the loop sees the flag after this step
            deadline = time.monotonic() + waiting[2]
            while time.monotonic() < deadline and self.par.waiting_in is waiting:
                time.sleep(0.05)
            if self.par.waiting_in is waiting:
                saved = self.saved()
                to_stderr(f"error: stopped by {signal.Signals(signum).name} while rank {self.par.rank} waited in "
                          f"{waiting[0]} at {self.par.at} for {time.monotonic() - waiting[1]:.0f} s (another rank is "
                          f"not answering){'; ' + saved if saved else ''}; rerun the same command to resume")
                os._exit(STUCK_EXIT)

    def _watch_parent(self, parent: int) -> None:
        """The parent watch: the parent pid changing means the launcher died; stop as SIGTERM does."""
        while self._watching:
            if os.getppid() != parent:
                self.reason = self.reason or f"the death of its launcher (parent pid {parent}), as SIGTERM"
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(PARENT_POLL_S)

    def restore(self) -> None:
        self._watching = False
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._pipe is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            os.close(self._pipe[1])  # the watchdog sees the end of the pipe and closes its own end
            self._pipe = None
