"""A package's names imported when first used, not when the package is imported (PEP 562's module __getattr__).

`python -m checkpoint` and `python -m data.prepare` import their package before their own first line, where
Ctrl-C during start-up becomes one line (errors.quiet_interrupts): a package whose __init__ imported torch (~1 s)
would run it before that. Each such package lists its names and their modules in `_EXPORTS` (the architecture
tests read that dict) and takes its __getattr__ from here.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def exports_on_first_use(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """The module __getattr__ of `package`: a name of `exports` (name -> its module in the package) is imported at
    its first use and kept in the package's namespace, so the next use finds it without this call."""
    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(f".{exports[name]}", package), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__
