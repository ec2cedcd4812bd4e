"""The shape of the code: imports run one way, without cycles; function-local imports only for optional
heavy dependencies; and a checkpoint's save and restore cover the same states."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import checkpoint.resume
from faults import inject
from checkpoint import load_checkpoint
from code_reading import ENTRY_SCRIPTS, PACKAGES, ROOT, graph, imports_of, parsed, project_modules, reachable, resolve

# imported inside functions on purpose: optional, heavy, or both; never needed on the main path
OPTIONAL = {"wandb", "datasets", "transformers", "huggingface_hub", "matplotlib", "liger_kernel",
            "pyarrow", "tokenizers", "psutil", "torchao"}  # pyarrow: jsonl/parquet/.gz/.zst sources only; tokenizers: bpe:<n>
# only; psutil (a dev requirement): bench.py's corpus row only; torchao: train.float8 only (GPU)
# `import data` stays light (tests/test_data_prepare.py checks it): data/__init__.py's module __getattr__
# imports the torch-using BatchLoader only when asked for, and the progress bar is imported when shown
LAZY_ON_PURPOSE = {("data", "data.loader"), ("data.build_writer", "tqdm")}
# Start-up time (test_starting_a_cli_imports_no_compiler_fsdp_or_dcp): the fused loss's torch.compiler.disable
# imports torch._dynamo (~0.7 s), DCP and FSDP import DTensor and sympy (~1 s); only the runs that use them pay.
LAZY_ON_PURPOSE |= {("runtime.loss_path", "model.fused_ce"),
                    ("training.builders", "training.parallel.sharding"),
                    ("training.parallel.distributed", "torch.distributed.device_mesh"),
                    ("checkpoint.sharded", "torch.distributed.checkpoint"),
                    ("checkpoint.sharded", "torch.distributed.checkpoint.api"),
                    ("checkpoint.sharded", "torch.distributed.checkpoint.metadata")}
# Memory: urllib.request brings http, email and ssl (~7 MB), in `python -m data.prepare` and every worker it forks.
LAZY_ON_PURPOSE |= {(m, f"urllib.{n}") for m in ("network", "data.download") for n in ("error", "request")}


def test_import_graph_sees_the_known_edges():
    """The walker itself: it must find edges we know exist, relative and absolute, or every other test
    here would pass vacuously."""
    g = graph()
    assert "model.gpt" in g["checkpoint.load"] and "model.fused_ce" in g["runtime.loss_path"]
    assert "training.step" in g["training.run"] and "training.chain" in g["training.loop"]
    assert "training.parallel.distributed" in g["training.loop"]
    assert "data.build" in g["data"] and "fileio" in g["data.build"]


@pytest.mark.parametrize("root", ["model", "checkpoint", "data", "runtime", "eval", "inference", "server"])
def test_inference_and_lower_layers_never_import_training(root):
    g = graph()
    starts = [m for m in g if m == root or m.startswith(root + ".")]
    assert starts, f"no module {root}: the list above names what is not there"
    bad = {s: sorted(t for t in reachable(s, g) | {s} if t == "training" or t.startswith("training."))
           for s in starts}
    assert not any(bad.values()), bad


def python_files() -> dict[str, Path]:
    """Every tracked Python file of the repository, tests and benchmarks included, as module name -> path (what
    git holds: a user's venv/, out/ or exports are no part of the code)."""
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = {}
    for name in listed.stdout.split():
        parts = Path(name).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = ROOT / name
    return files


def test_no_test_module_imports_another():
    """What two test modules share lives in a helper module (tests/figure_inputs.py, multirank_runs.py, ...): a test
    module imported by another runs its module-level code twice and ties the two files' fixtures together."""
    tests = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.name} imports {n}" for n in names if n.split(".")[0] in tests]
    assert tests and not found, found


def test_nothing_imports_an_entry_script():
    """train.py, sample.py, bench.py, chat.py and serve.py are entry points: what they do lives in a package,
    which the tests and the other entry points import; nothing imports a script, the tests included (a test
    that imported one tested what a user never runs the way the user runs it, and kept the script fat)."""
    files = python_files()
    scripts = {name: ROOT / f"{name}.py" for name in ENTRY_SCRIPTS}
    importing = {m: sorted({t for t, _ in imports_of(m, p, scripts) if t in scripts} | dynamic_imports(p))
                 for m, p in files.items()}
    offenders = {m: scripts for m, scripts in importing.items() if scripts}
    assert not offenders, f"these import an entry script: {offenders}"


DYNAMIC = {"import_module", "__import__", "run_module", "run_path"}  # importlib's, the builtin, runpy's


def dynamic_imports(path: Path) -> set[str]:
    """The entry scripts a file imports by name at run time: a string naming one (or its file) given to
    importlib.import_module, __import__, runpy.run_module or runpy.run_path."""
    found = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in DYNAMIC:
            for arg in node.args[:1]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    name = Path(arg.value).name.removesuffix(".py")
                    if name in ENTRY_SCRIPTS:
                        found.add(name)
    return found


def test_the_entry_script_check_sees_imports_of_a_script(tmp_path):
    """The check above must be able to fail: the walker finds both spellings of importing a script, and the
    run-time ones (tests/test_closed_pipe.py imported train.py by importlib.import_module("train"), unseen)."""
    f = tmp_path / "showcase.py"
    f.write_text("import chat\nfrom sample import DEFAULT_PROMPT\n\ndef f():\n    import serve\n")
    found = imports_of("training.report.showcase", f, {"chat": f, "sample": f, "serve": f})
    assert {name for name, _ in found} == {"chat", "sample", "serve"}
    g = tmp_path / "runner.py"
    g.write_text("import importlib, runpy\nimportlib.import_module('train').main\n__import__('bench')\n"
                 "runpy.run_path('/x/sample.py')\nrunpy.run_module('serve')\nimportlib.import_module('training.cli')\n")
    assert dynamic_imports(g) == {"train", "bench", "sample", "serve"}


# each entry script and the module whose `main` it runs
COMMANDS = {"train": "training.cli", "sample": "inference.sample_cli", "chat": "inference.chat_cli",
            "serve": "server.cli", "bench": "benchmarks.cli"}


def is_main_guard(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ('__name__ == "__main__"', "__name__ == '__main__'")


@pytest.mark.parametrize("script", ENTRY_SCRIPTS)
def test_a_thin_entry_script_only_starts_its_command(script):
    """Entry points are thin ("parse and call"): the script holds its command's usage (the docstring) and runs
    the `main` of its command's module with errors.run_cli, Ctrl-C quiet (errors.quiet_interrupts) until that
    heavy import is done (errors.start_up_done), each call under `if __name__ == "__main__"` (a spawned worker
    re-imports the script as __mp_main__: an unguarded call would start the command again in it); no function,
    class or lambda of its own. Before: train.py (403 lines: the chain and the loop), sample.py (385), chat.py
    and bench.py held their commands, and some thirty test modules imported them."""
    assert set(COMMANDS) == set(ENTRY_SCRIPTS)
    tree = parsed(ROOT / f"{script}.py")
    own = [getattr(n, "name", "a lambda") for n in ast.walk(tree)
           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))]
    assert not own, f"{script}.py defines {own}: move it into {COMMANDS[script]}"
    imports = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            imports += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            imports += [f"{node.module}:{a.name}" for a in node.names]
    assert sorted(imports) == sorted(["errors", f"{COMMANDS[script]}:main"]), f"{script}.py imports {imports}"
    guards = [n for n in tree.body if is_main_guard(n)]
    guarded = {id(c) for g in guards for c in ast.walk(g) if isinstance(c, ast.Call)}
    calls = sorted((n.lineno, ast.unparse(n.func), id(n) in guarded) for n in ast.walk(tree) if isinstance(n, ast.Call))
    assert [(c, g) for _, c, g in calls] == [("errors.quiet_interrupts", True), ("errors.start_up_done", True),
                                             ("errors.run_cli", True)], calls
    heavy = next(n.lineno for n in tree.body if isinstance(n, ast.ImportFrom) and n.module != "__future__")
    assert calls[0][0] < heavy < calls[1][0]


def test_the_thin_script_check_sees_an_unguarded_call_and_another_commands_main(tmp_path, monkeypatch):
    """The check above must be able to fail: on a call outside the guard, and on a script that runs another
    command's main."""
    import code_reading

    serve = (ROOT / "serve.py").read_text(encoding="utf-8")
    for text in (serve.replace('if __name__ == "__main__":\n    errors.start_up_done()\n', "if True:\n    errors.start_up_done()\n"),
                 serve.replace("from server.cli import main", "from inference.chat_cli import main")):
        assert text != serve
        (tmp_path / "serve.py").write_text(text, encoding="utf-8")
        monkeypatch.setattr(code_reading, "ROOT", tmp_path)
        monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
        with pytest.raises(AssertionError):
            test_a_thin_entry_script_only_starts_its_command("serve")


def test_model_imports_nothing_from_data_and_data_nothing_from_model():
    g = graph()
    for low, high in (("model", "data"), ("data", "model"), ("runtime", "data")):
        for m in g:
            if m == low or m.startswith(low + "."):
                assert not any(t == high or t.startswith(high + ".") for t in reachable(m, g)), (m, high)


def test_project_imports_have_no_cycles():
    g = graph()
    cycles = [m for m in g if m in reachable(m, g)]
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_function_local_imports_are_only_for_optional_heavy_dependencies():
    offenders = []
    for module, path in project_modules().items():
        tree = parsed(path)
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [resolve(node, module, path.name == "__init__.py")]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] not in OPTIONAL and (module, name) not in LAZY_ON_PURPOSE:
                        offenders.append(f"{module}: {name} (line {node.lineno})")
    assert not offenders, offenders



def test_the_prepare_cli_imports_no_network_stack_or_pyarrow():
    # its processes' memory is issue 22's target: pyarrow comes only with a parquet or compressed source,
    # urllib.request only with a download
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import data.prepare; "
            "print([m for m in ('urllib.request', 'ssl', 'http.client', 'pyarrow', 'torch') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_starting_a_cli_imports_no_compiler_fsdp_or_dcp():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "import training.loop, inference.sample_cli, inference.chat_cli, checkpoint.export, checkpoint.__main__; "
            "print([m for m in ('torch._dynamo', 'torch.distributed.checkpoint', 'torch.distributed.fsdp', "
            "'torch.distributed.tensor') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


class RecordingDict(dict):
    """A checkpoint that remembers which of its top-level entries were read."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def test_saving_and_restoring_cover_the_same_states(tmp_path, monkeypatch):
    """Every entry a checkpoint holds is read back when the run resumes, and nothing is read that was
    not saved: a stateful part added to only one side fails here."""
    from tiny_runs import run, tiny_argv  # noqa: F401  (the tiny run's settings)
    from data import DataConfig, prepare_data

    root = tmp_path / "prepared"
    prepare_data(DataConfig(tokenizer="char", root=str(root)), progress=False)
    out = tmp_path / "out"
    with inject(interrupt_after=2):
        run(out, root, "--train.max_iters=4", "--model.dropout=0.1", "--train.dtype=float16")
    saved = load_checkpoint(out)
    recorded = RecordingDict(saved)
    monkeypatch.setattr(checkpoint.resume, "load_checkpoint", lambda path: recorded)
    res = run(out, root, "--train.max_iters=4", "--model.dropout=0.1", "--train.dtype=float16")
    assert res["iter"] == 4
    written = set(saved) - {"format", "version"}  # the file format's stamp, checked by load_checkpoint
    assert recorded.read - written == set(), "restored but never saved"
    assert written - recorded.read == set(), "saved but never restored"


def documented_order(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """docs/architecture.md's import order: (the base every package may import, {package: packages it may import})."""
    block = re.search(r"^```\n(\S[^\n]*<- everything.*?)^```", text, re.M | re.S)
    assert block, "docs/architecture.md has no import-order block"
    base, allowed = set(), {}
    for line in block.group(1).splitlines():
        rule = line.split("(")[0]
        if "<- everything" in rule:
            base = {n.strip() for n in rule.split("<-")[0].split(",")}
        elif "->" in rule:
            left, right = rule.split("->", 1)
            allowed[left.strip().removesuffix("/").removesuffix(".py")] = set(re.findall(r"[a-z_]+", right)) - {"the", "base", "only"}
    return base, allowed


def test_imports_between_packages_follow_the_documented_order():
    """Before: the order was prose only: docs/architecture.md said checkpoint/ -> model, data and training/ ->
    checkpoint, model, data, runtime, while checkpoint imported runtime and training imported eval, and the
    base named four modules of seven; nothing compared them."""
    base, allowed = documented_order((ROOT / "docs" / "architecture.md").read_text())
    wrong = set()
    for module, targets in graph().items():
        here = module.split(".")[0]
        for there in {t.split(".")[0] for t in targets} - {here}:
            if here in base:
                ok = there in base
            else:
                assert here in allowed, f"docs/architecture.md's import order has no line for {here}"
                ok = there in base or there in allowed[here]
            if not ok:
                wrong.add(f"{module} -> {there}")
    assert not wrong, f"imports the documented order does not allow: {sorted(wrong)}"
    # the reader itself: a made-up order that forbids an edge the project has
    _, strict = documented_order("```\nerrors  <- everything\nmodel/ -> the base only (x)\ntraining/ -> eval, data\n```")
    assert strict == {"model": set(), "training": {"eval", "data"}}
