"""Ctrl-C while any command starts up is one line, `interrupted`, and exit 130: the five scripts and every
`python -m` command (a module with a `__main__` block), found by reading the code, so that a new command
joins. A user's Ctrl-C lands wherever the imports are; here it lands, every time, on the first module the
command's own code imports (tests/ctrl_c_at_first_import.py): before the guard of errors.quiet_interrupts
that is a KeyboardInterrupt traceback, exit -2. The package a `python -m` command lives in is imported
before the command's first line, so it must import nothing heavy itself (checkpoint/ and data/ imported
torch and tiktoken there: their names are now imported on first use)."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from code_reading import ENTRY_SCRIPTS, ROOT, parsed, project_modules

# started by another program, never by a user: bench.py's ranks (benchmarks/fsdp.py) and its plain baseline
# (benchmarks/pool_prepare.py, build-nanogpt's way: "no resume, no checks", by design)
NOT_COMMANDS = {"benchmarks.fsdp": "bench.py's DDP/FSDP rank", "benchmarks.pool_prepare": "bench.py's baseline"}
HEAVY = ("torch", "numpy", "tiktoken", "matplotlib", "transformers", "datasets", "wandb", "fastapi")


def has_main_block(path) -> bool:
    return any(isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) for node in parsed(path).body)


def commands() -> list[str]:
    mods = project_modules()
    found = [m.removesuffix(".__main__") for m, path in mods.items() if m not in ENTRY_SCRIPTS and has_main_block(path)]
    return sorted(set(found) - set(NOT_COMMANDS))


def test_the_commands_are_found():
    """The reading finds the commands the docs name (it fails if the scan finds none or misses one)."""
    assert {"checkpoint", "checkpoint.export", "data.prepare", "data.tasks", "eval.chat_tasks", "eval.hellaswag",
            "eval.inspect", "training.plot", "benchmarks.sft_batches"} <= set(commands())


def interrupt(target: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tests" / "ctrl_c_at_first_import.py"), *target],
                          capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.mark.parametrize("command", [*(f"{s}.py" for s in ENTRY_SCRIPTS), *commands()])
def test_ctrl_c_at_the_first_import_of_start_up_is_one_line(command, tmp_path):
    r = interrupt([command], tmp_path)
    assert "fired" in r.stdout, (r.stdout, r.stderr[-2000:])  # the Ctrl-C did land inside the command's imports
    assert r.returncode == 130 and r.stderr == "interrupted\n", (r.returncode, r.stderr[-2000:])


@pytest.mark.parametrize("package", sorted({c.rsplit(".", 1)[0] if "." in c else c for c in commands()}))
def test_a_commands_package_imports_nothing_heavy(package):
    """`python -m <package>.<command>` imports the package before the command's first line: a heavy import
    there runs before the command can make Ctrl-C one line."""
    code = f"import sys; import {package}; print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr[-2000:])


def guard_calls(path) -> list[list[str]]:
    """The calls each `if __name__ == "__main__":` block of the module makes, in order, as source text."""
    return [[ast.unparse(stmt.value.func) for stmt in node.body if isinstance(stmt, ast.Expr)
             and isinstance(stmt.value, ast.Call)]
            for node in parsed(path).body if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)]


@pytest.mark.parametrize("command", commands())
def test_a_command_quiets_ctrl_c_first_and_hands_it_back_before_its_work(command):
    """The first guard (before the imports) calls errors.quiet_interrupts; the last one calls errors.start_up_done
    before run_cli: without it a Ctrl-C during the work would end the process at once (os._exit), with no
    cleanup (a half-written output's temp file left, no checkpoint) and no test would notice."""
    mods = project_modules()
    blocks = guard_calls(mods.get(f"{command}.__main__") or mods[command])  # (python -m checkpoint: its __main__)
    assert len(blocks) >= 2 and blocks[0] == ["errors.quiet_interrupts"], blocks
    last = blocks[-1]
    runs = [i for i, call in enumerate(last) if call.endswith("run_cli")]
    assert last[:1] == ["errors.start_up_done"] and runs, last
