"""SIGINT/SIGTERM become a flag the training loop checks after each step (finish, checkpoint, exit 0).
A second signal stops at once with KeyboardInterrupt."""
from __future__ import annotations

import signal
import threading


class StopFlag:
    def __init__(self) -> None:
        self.requested = False
        self.reason = ""
        self._previous: dict[int, object] = {}

    def request(self, reason: str) -> None:
        self.requested = True
        self.reason = self.reason or reason

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.request(signal.Signals(signum).name)

    def install(self) -> "StopFlag":
        if threading.current_thread() is threading.main_thread():  # signal.signal only works there
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
