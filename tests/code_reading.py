"""Reading the project's own code for the architecture tests: its modules, their syntax trees (parsed once
per test process) and the graph of their imports."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NANOGPT = ROOT.parent / "shared" / "anchors" / "nanogpt"  # nanoGPT's own code, ../shared beside the checkout, as in CI
PACKAGES = ("model", "checkpoint", "data", "runtime", "inference", "training", "benchmarks", "eval", "server")
ENTRY_SCRIPTS = ("train", "sample", "bench", "chat", "serve")  # thin; run, never imported
TOP_MODULES = (*ENTRY_SCRIPTS, "errors", "bounded", "fileio", "locks", "settings", "network", "ownership")


def project_modules() -> dict[str, Path]:
    mods = {name: ROOT / f"{name}.py" for name in TOP_MODULES if (ROOT / f"{name}.py").is_file()}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def resolve(node: ast.ImportFrom, module: str, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.AST:
    """A file's syntax tree, parsed once per test process (the tests only read the trees)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def imports_of(module: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, bool]]:
    """(project module imported, inside a function?) for every import statement of `module`."""
    tree = parsed(path)
    local_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = resolve(node, module, path.name == "__init__.py")
            names = [target] + [f"{target}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name in mods:
                out.append((name, id(node) in local_nodes))
    if path.name == "__init__.py":  # a package's names imported on first use (its __getattr__): _EXPORTS's modules
        for node in tree.body:
            if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["_EXPORTS"]
                    and isinstance(node.value, ast.Dict)):
                out += [(f"{module}.{v.value}", True) for v in node.value.values if f"{module}.{v.value}" in mods]
    return out


def graph() -> dict[str, set[str]]:
    mods = project_modules()
    return {m: {t for t, _ in imports_of(m, p, mods) if t != m} for m, p in mods.items()}


def reachable(start: str, g: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in g.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def product_trees() -> dict[str, ast.AST]:
    return {m: parsed(p) for m, p in project_modules().items()}
