"""SIGINT/SIGTERM become a flag the training loop checks after each step (finish, checkpoint, exit 0).
A second signal stops at once with KeyboardInterrupt.

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


class StopFlag:
    def __init__(self, par=None, saved: Callable[[], str] = lambda: "") -> None:
        self.requested = False
        self.reason = ""
        self.par = par  # training.distributed.Parallel: what the main thread waits in, if anything
        self.saved = saved  # what is on disk, for the line (e.g. "out/ckpt.pt holds iter 40")
        self._previous: dict[int, object] = {}
        self._pipe: tuple[int, int] | None = None
        self._old_wakeup = -1

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
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
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
            if signum not in (signal.SIGINT, signal.SIGTERM):
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

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._pipe is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            os.close(self._pipe[1])  # the watchdog sees the end of the pipe and closes its own end
            self._pipe = None
