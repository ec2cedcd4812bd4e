"""Run one command, a script (`train.py`) or a module as `python -m` takes it (`eval.inspect`), with Ctrl-C
(SIGINT) sent to this process when the command's own code first imports a module not yet imported: a
Ctrl-C inside its start-up, at the same moment every run (tests/test_ctrl_c_at_start_up.py).

    python tests/ctrl_c_at_first_import.py train.py | eval.inspect
"""
from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class CtrlCAtFirstImport:
    """A finder that imports nothing: asked for a module while the command's file is running its top level, it
    sends SIGINT once (the handler runs as soon as the import goes on)."""

    def __init__(self, file: Path):
        self.file, self.fired = str(file), False

    def find_spec(self, name, path=None, target=None):
        frame = sys._getframe(1)
        while frame is not None and not self.fired:
            if frame.f_code.co_filename == self.file:
                self.fired = True
                print(f"fired at the import of {name}", flush=True)
                os.kill(os.getpid(), signal.SIGINT)
            frame = frame.f_back
        return None


def main(command: str) -> None:
    sys.path.insert(0, str(ROOT))  # as `python train.py` (the script's folder) or `python -m` run in the checkout
    import errors  # noqa: F401 (every command's first import: the one that fires is the one after its guard)

    if command.endswith(".py"):
        file = ROOT / command
        sys.meta_path.insert(0, CtrlCAtFirstImport(file))
        sys.argv = [str(file)]
        runpy.run_path(str(file), run_name="__main__")
    else:
        import importlib.util

        spec = importlib.util.find_spec(f"{command}.__main__" if command == "checkpoint" else command)
        sys.meta_path.insert(0, CtrlCAtFirstImport(Path(spec.origin)))
        runpy.run_module(command, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1])
