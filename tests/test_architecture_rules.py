"""The shape of the code, rule by rule: one owner for each thing (the loss, user errors, checkpoint names and
files, the parallel context), one plan and one chain (set_up, a frozen config), errors told apart by type
and not by their words, classes by constructor, no file over 500 lines, prose references that
resolve."""
from __future__ import annotations

import ast
import re
import subprocess

import pytest

from code_reading import ROOT, parsed, product_trees, project_modules


# ------------------------------------------------------------------------------------------ one owner each

def loss_attribute_sets(trees: dict[str, ast.AST]) -> list[str]:
    """Every assignment (or setattr) of an attribute named loss_* : the loss path was once three such
    attributes set on the model from outside; the loss is now an object of its own (runtime/loss_path.py's
    LMLoss). argparse's `args` namespace is not a model."""
    offenders = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                if (isinstance(t, ast.Attribute) and t.attr.startswith("loss_")
                        and getattr(t.value, "id", None) != "args"):
                    offenders.append(f"{module}:{node.lineno} .{t.attr}")
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("loss_")):
                offenders.append(f"{module}:{node.lineno} setattr {node.args[1].value}")
    return offenders


def test_nothing_sets_a_loss_attribute_on_the_model():
    """The model computes logits and nothing else; how the loss runs lives in the loss object that the chain
    of builders makes. No product module and no test sets a loss_* attribute, and a GPT has none, before or
    after a fused loss ran through it."""
    tests = {f"tests.{p.stem}": ast.parse(p.read_text(encoding="utf-8")) for p in sorted((ROOT / "tests").glob("*.py"))}
    assert not loss_attribute_sets({**product_trees(), **tests})
    assert loss_attribute_sets({"old": ast.parse("model.loss_chunk_rows = 7\nsetattr(m, 'loss_weight_grad_mm', f)")})

    import torch

    from model import GPT, GPTConfig
    from runtime.loss_path import LMLoss

    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=300))
    before = set(vars(model))
    x = torch.randint(0, 300, (2, 8))
    LMLoss(chunk_rows=5, exp_block_rows=64)(model, x, x).backward()
    assert set(vars(model)) == before and not [a for a in vars(model) if a.startswith("loss")]


def user_error_raises(trees: dict[str, ast.AST]) -> list[str]:
    """Under model/: any use of errors.UserError, and any raise at all: the model, its generation loop, its
    fused loss and its HF mapping assert what they assume (as nanoGPT does); what a user's input or file
    gets wrong is found at the edges (the config, checkpoint/, the entry points, the server)."""
    offenders = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Name, ast.Attribute)) and getattr(node, "id", getattr(node, "attr", "")) == "UserError":
                offenders.append(f"{module}:{node.lineno} UserError")
            if isinstance(node, ast.alias) and node.name == "UserError":
                offenders.append(f"{module}:{node.lineno} imports UserError")
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "errors":
                offenders.append(f"{module}:{node.lineno} imports errors")
            if isinstance(node, ast.Raise):
                offenders.append(f"{module}:{node.lineno} raises")
    return offenders


def test_model_raises_no_user_errors():
    """User errors are found and said at the edges (the config, the checkpoint loader, the entry points),
    never in model/: GPTConfig's rules live in checkpoint/model_config.py, what an HF directory holds is
    checked by checkpoint/hf.py, prompts and token counts by their callers; model/ asserts."""
    trees = {m: t for m, t in product_trees().items() if m == "model" or m.startswith("model.")}
    assert {"model.gpt", "model.hf", "model.generate", "model.fused_ce"} <= trees.keys()
    assert not user_error_raises(trees), user_error_raises(trees)
    old = ast.parse("from errors import UserError\ndef forward():\n    raise ValueError('too long')\n")
    assert len(user_error_raises({"model.hf": old})) == 3


def test_no_product_module_catches_an_assertion():
    """An assert is what the code assumes, never an input check: python -O skips asserts, so a check that
    catches AssertionError would pass anything there (data/shards.py's resume record was one)."""
    def catches(tree: ast.AST) -> list[int]:
        return [h.lineno for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.type is not None
                and any(isinstance(n, ast.Name) and n.id == "AssertionError" for n in ast.walk(h.type))]
    offenders = [f"{m}:{line}" for m, tree in product_trees().items() for line in catches(tree)]
    assert not offenders, offenders
    assert catches(ast.parse("try:\n    assert x\nexcept (KeyError, AssertionError):\n    pass\n")) == [3]


def test_nothing_under_model_mentions_the_cpu_isa_packing_or_threads():
    """model/ is the architecture, the KV cache, the loss and the HF weight mapping: hardware tuning
    (oneDNN weight packing, ISA checks, thread counts) lives in runtime/."""
    words = re.compile(r"\b(avx\w*|amx|isa|onednn|mkldnn|prepack\w*|packed|packing|threads?|num_threads|"
                       r"set_num_threads|cpu_capability)\b", re.IGNORECASE)
    hits = [f"{p.name}:{i}: {line.strip()}" for p in sorted((ROOT / "model").glob("*.py"))
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if words.search(line)]
    assert not hits, hits


def test_the_words_the_model_check_looks_for_are_found_where_they_are():
    """The check above must be able to fail: the same pattern finds runtime/decoding.py's packing."""
    text = (ROOT / "runtime" / "decoding.py").read_text(encoding="utf-8")
    assert re.search(r"\b(prepack\w*|packed|mkldnn)\b", text, re.IGNORECASE)


def test_checkpoint_names_are_spelled_only_in_one_place():
    """The file names ckpt.pt / best.pt are spelled once, in ownership.py (which recognises an out_dir by them
    and stays importable without torch); checkpoint/format.py re-exports them as CKPT_NAME / BEST_NAME, and no
    other product module writes them as string literals (they import the names, or ask the Checkpointer)."""
    spelled = [f"{m}:{node.lineno}" for m, tree in product_trees().items()
               for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in ("ckpt.pt", "best.pt")]
    assert [s.split(":")[0] for s in spelled] == ["ownership", "ownership"], spelled


def test_every_part_a_run_registers_is_in_the_checkpoint_schema():
    from checkpoint import SCHEMA, Checkpointer

    ckpt = Checkpointer("unused")
    with pytest.raises(ValueError, match="SCHEMA"):
        ckpt.register("throwaway", object())
    for name in ("model", "optimizer", "scaler", "loader", "train", "rng"):
        assert name in SCHEMA


def test_only_the_checkpoint_module_opens_checkpoint_files():
    """Every read or write of weight files (our checkpoints, HF's model.safetensors and
    pytorch_model.bin) goes through checkpoint/: no torch.load / torch.save, no safetensors
    load_file / save_file / safe_open anywhere else in the product."""
    opening = {"load", "save", "load_file", "save_file", "safe_open"}
    found, offenders = [], []
    for module, tree in product_trees().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
            if name in ("load_file", "save_file", "safe_open") or (owner == "torch" and name in opening):
                found.append(module)
                if not module.startswith("checkpoint"):
                    offenders.append(f"{module}:{node.lineno} {owner + '.' if owner else ''}{name}")
    assert "checkpoint.format" in found and "checkpoint.hf" in found  # the scan sees the owner's own calls
    assert not offenders, offenders


# ------------------------------------------------------------------------------------ one plan, one chain

def _function(module: str, name: str) -> ast.FunctionDef:
    tree = parsed(project_modules()[module])
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def test_set_up_is_a_chain_of_at_most_40_lines():
    f = _function("training.chain", "set_up")
    assert f.end_lineno - f.lineno + 1 <= 40, f"training/chain.py's set_up is {f.end_lineno - f.lineno + 1} lines"
    # the benchmarks build their steps by calling the same chain, not by chaining builders by hand
    for module in ("benchmarks.train", "benchmarks.fsdp", "benchmarks.auto_batch", "benchmarks.muon"):
        calls = {getattr(n.func, "id", getattr(n.func, "attr", None)) for n in ast.walk(product_trees()[module])
                 if isinstance(n, ast.Call)}
        assert "build_trainer" in calls, module
        assert not calls & {"shard_model", "build_optimizers", "parallelize", "loss_path", "make_scaler"}, module


PARALLEL_OWNER = "training.parallel.distributed"
# below training/ (which it may not import), every rank takes part in each sharded save: DCP's own rule
COLLECTIVES_TOO = {"checkpoint.sharded"}
COLLECTIVES = {"all_reduce", "broadcast_object_list", "all_gather_object", "new_group", "barrier", "broadcast",
               "all_gather", "reduce_scatter"}


def parallel_offenders(trees: dict[str, ast.AST]) -> list[str]:
    """Code outside the parallel context that takes a process group, passes one, calls a collective itself
    (`dist.x` or `torch.distributed.x`), or compares train.parallel with a string."""
    offenders = []
    for module, tree in trees.items():
        if module == PARALLEL_OWNER:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for a in node.args.args + node.args.kwonlyargs:
                    is_param_group = isinstance(a.annotation, ast.Name) and a.annotation.id == "dict"  # an optimizer's
                    if a.arg in ("group", "process_group", "pg") and not is_param_group:
                        offenders.append(f"{module}:{node.lineno} takes {a.arg!r}")
            if isinstance(node, ast.Call):
                offenders += [f"{module}:{node.lineno} passes {k.arg}=" for k in node.keywords
                              if k.arg in ("group", "process_group")]
                f = node.func
                owner = ast.unparse(f.value) if isinstance(f, ast.Attribute) else ""
                if (isinstance(f, ast.Attribute) and f.attr in COLLECTIVES and module not in COLLECTIVES_TOO
                        and owner in ("dist", "tdist", "torch_dist", "torch.distributed")):
                    offenders.append(f"{module}:{node.lineno} calls {owner}.{f.attr}")
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                parts = [node.left, *node.comparators]
                strings = [p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)]
                attrs = [p.attr for p in parts if isinstance(p, ast.Attribute)]
                if {"ddp", "fsdp"} & set(strings) or "parallel" in attrs:
                    offenders.append(f"{module}:{node.lineno} compares train.parallel")
    return offenders


def test_only_the_parallel_context_takes_a_control_group_or_tests_train_parallel():
    """Which ranks take part in a call is answered by training/parallel/distributed.py's Parallel: no other function
    takes a process group, passes one, calls a collective itself, or compares train.parallel with a string."""
    offenders = parallel_offenders(product_trees())
    assert not offenders, offenders


def test_the_parallel_check_finds_what_it_looks_for():
    """The scan above must be able to fail: on the old shape of the code it flags each kind."""
    old = ast.parse("def f(x, dist, group=None):\n"
                    "    if t.parallel == 'fsdp':\n"
                    "        dist.all_reduce(x, group=group)\n"
                    "    torch.distributed.broadcast_object_list([x], src=0)\n")
    found = parallel_offenders({"training.builders": old})
    assert sorted(f.split(" ", 1)[1] for f in found) == sorted([
        "takes 'group'", "compares train.parallel", "passes group=", "calls dist.all_reduce",
        "calls torch.distributed.broadcast_object_list"])


def matplotlib_imports(trees: dict[str, ast.AST]) -> list[str]:
    """module:line of every import of matplotlib (or a part of it): a statement, or importlib's or the builtin's
    call with the name spelled out."""
    def named(name) -> bool:
        return isinstance(name, str) and (name == "matplotlib" or name.startswith("matplotlib."))

    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                hit = any(named(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                hit = node.level == 0 and named(node.module)
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                hit = func in ("import_module", "__import__") and named(node.args[0].value)
            else:
                continue
            if hit:
                found.append(f"{module}:{node.lineno}")
    return found


def test_only_the_drawing_module_imports_matplotlib():
    """Before: eval/figures.py, training/plot.py (through pyplot) and benchmarks/gpu_curves.py each imported
    matplotlib their own way, and a bad MPLBACKEND (agg2) made that import raise: a traceback at the training
    loop's inspect step, in python -m training.plot and in python -m eval.inspect. eval/drawing.py's
    matplotlib_agg imports it without reading MPLBACKEND; nothing else may (its submodules included)."""
    offenders = [where for where in matplotlib_imports(product_trees()) if not where.startswith("eval.drawing:")]
    assert not offenders, f"import matplotlib only through eval.drawing.matplotlib_agg: {offenders}"
    seen = matplotlib_imports({"m": ast.parse("import matplotlib.pyplot as plt\nfrom matplotlib import ticker\n"
                                              "importlib.import_module('matplotlib.figure')\nfrom . import x\n"
                                              "import matplotlibx\n")})
    assert seen == ["m:1", "m:2", "m:3"]
    assert any(w.startswith("eval.drawing:") for w in matplotlib_imports(product_trees()))


def test_no_file_is_over_500_lines():
    """One concern per file, the tests' own included."""
    files = [*project_modules().values(), *sorted((ROOT / "tests").glob("*.py"))]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, long


def test_a_loaded_config_is_never_changed():
    """load_config freezes what it returns: every field of every section refuses assignment, so a decision
    made at start-up can only go into the run plan."""
    import dataclasses

    from training.config.sections import load_config

    cfg = load_config(["--train.max_iters=7"])
    for section in dataclasses.fields(cfg):
        obj = getattr(cfg, section.name)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(cfg, section.name, obj)
        for f in dataclasses.fields(obj):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(obj, f.name, getattr(obj, f.name))
    assert cfg.train.max_iters == 7


# ------------------------------------------------------------------------- errors by type, classes by constructor

# the one place that reads a library's message to tell what went wrong: torch's CPU allocator and its collectives
# raise plain RuntimeErrors, with no type that says "out of memory" or "another rank went away"
MESSAGE_READERS = {("errors", "is_out_of_memory"), ("errors", "lost_peer"), ("errors", "no_deterministic_algorithm")}


def message_comparisons(trees: dict[str, ast.AST]) -> list[str]:
    """Each comparison of an exception's message text: `... in str(e)`, `str(e) == ...`, or the same on a name
    that holds str(e) (`text = str(e).lower()`), where e is caught by an except clause or is a parameter
    typed as an exception; as 'module.function:line'."""
    found = []
    for module, tree in trees.items():
        for f in ast.walk(tree):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            errors = {h.name for h in ast.walk(f) if isinstance(h, ast.ExceptHandler) and h.name}
            errors |= {a.arg for a in f.args.args if a.annotation is not None
                       and re.search(r"Error|Exception", ast.unparse(a.annotation))}

            def message_of(node: ast.AST) -> bool:  # str(e), or a method chain on it: str(e).lower()
                while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    node = node.func.value
                return (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "str" and len(node.args) == 1
                        and isinstance(node.args[0], ast.Name) and node.args[0].id in errors)
            texts = {t.id for a in ast.walk(f) if isinstance(a, ast.Assign) and message_of(a.value)
                     for t in a.targets if isinstance(t, ast.Name)}
            for c in ast.walk(f):
                if isinstance(c, ast.Compare) and not isinstance(c.ops[0], (ast.Is, ast.IsNot)) and any(
                        message_of(o) or (isinstance(o, ast.Name) and o.id in texts) for o in [c.left, *c.comparators]):
                    found.append(f"{module}.{f.name}:{c.lineno}")
    return sorted(set(found))


def test_no_module_decides_what_went_wrong_by_an_errors_words():
    """Errors are raised and caught by type; only errors.py reads a library's words, where the library gives
    no type (MESSAGE_READERS)."""
    found = message_comparisons(product_trees())
    readers = {f.split(":")[0].rsplit(".", 1)[1] for f in found if f.startswith("errors.")}
    assert readers == {name for _, name in MESSAGE_READERS}  # the scan sees the readers themselves
    offenders = [f for f in found if (f.split(":")[0].rsplit(".", 1)[0], f.split(":")[0].rsplit(".", 1)[1])
                 not in MESSAGE_READERS]
    assert not offenders, offenders


def test_the_message_check_finds_what_it_looks_for():
    old = ast.parse("def restore(e: RuntimeError):\n    text = str(e).lower()\n    return 'timed out' in text\n"
                    "def f():\n    try:\n        g()\n    except UserError as err:\n"
                    "        if where in str(err):\n            raise\n")
    assert message_comparisons({"m": old}) == ["m.f:8", "m.restore:3"]


def test_no_object_changes_its_class():
    """`obj.__class__ = Other` hides the type a reader sees at construction; the constructor is chosen instead."""
    offenders = [f"{m}:{n.lineno}" for m, tree in product_trees().items() for n in ast.walk(tree)
                 if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                 and any(isinstance(t, ast.Attribute) and t.attr == "__class__"
                         for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    assert not offenders, offenders


def test_trainings_top_level_holds_at_most_15_files():
    """The chain and the loop stand at training/'s top; parallelism, the config and the reports have rooms."""
    top = sorted(p.name for p in (ROOT / "training").iterdir() if p.is_file() and p.suffix == ".py")
    assert len(top) <= 15, top


REFERENCE = re.compile(r"\b((?:[a-z_]+/)*[a-z_]+\.py)'s ([A-Za-z_][A-Za-z0-9_]*)")
PARITY = re.compile(r"\b(?:as|like) [a-z_/]+\.py (?:does|do|did)\b|\bfollows too\b|'s rule too\b")


def dangling_references(files: dict[str, str], parity: bool = True) -> list[str]:
    """Prose that names another file's function or constant ("runtime/loss_path.py's CHUNK_BYTES") where the
    file or the name is gone, and prose that says some code behaves as another file does ("as sample.py
    does"): a reference that nothing checks rots silently, so the first must resolve and the second is an
    import instead. Names are identifiers with an underscore or a capital (not all capitals: FSDP, DDP)."""
    found = []
    for where, text in files.items():
        for i, line in enumerate(text.splitlines(), 1):
            if parity and PARITY.search(line):
                found.append(f"{where}:{i}: {PARITY.search(line).group(0)!r}")
            for path, name in REFERENCE.findall(line):
                if not ("_" in name or any(c.isupper() for c in name)) or name.isupper() and "_" not in name:
                    continue
                target = next((p for p in (ROOT / path, (ROOT / where).parent / path) if p.is_file()), None)
                defined = target is not None and re.search(
                    rf"^\s*(?:(?:async )?def|class)\s+{name}\b|^\s*(?:\w+\s*,\s*)*{name}\b(?:\s*,\s*\w+)*\s*(?::[^=]*)?="
                    rf"|\bself\.{name}\s*=",
                    target.read_text(encoding="utf-8"), re.M)
                if not defined:
                    found.append(f"{where}:{i}: {path}'s {name}")
    return found


def test_prose_references_to_other_files_resolve():
    files = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in project_modules().values()}
    assert not dangling_references(files), dangling_references(files)
    old = {"runtime/decoding.py": "# the policy training follows too (runtime/device.py's with_compile_fallback)\n"
                                  "x = 1  # as train.py does\n# model/gpt.py's no_such_function, model/gpt.py's NoSuchClass\n"
                                  "# runtime/loss_path.py's CHUNK_BYTES, bench.py's FSDP rows\n"}
    assert [f.split(": ", 1)[1] for f in dangling_references(old)] == [
        "'follows too'", "'as train.py does'", "model/gpt.py's no_such_function", "model/gpt.py's NoSuchClass"]


def test_the_docs_references_to_a_files_names_resolve():
    """The same for the docs (every tracked .md, code spans read as text): a guide that sends a reader to
    "`training/chain.py`'s `set_up`" must find it there; a move that leaves the sentence behind fails here.
    (A doc may say a command behaves as another does: the parity rule is for code.)"""
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    docs = {name: (ROOT / name).read_text(encoding="utf-8").replace("`", "") for name in listed.stdout.split()}
    assert len(docs) > 5 and "docs/architecture.md" in docs
    assert not dangling_references(docs, parity=False), dangling_references(docs, parity=False)
    moved = {"docs/x.md": "training/chain.py's set_up, train.py's set_up, training/loop.py's NonFiniteGuard"}
    assert [f.split(": ", 1)[1] for f in dangling_references(moved, parity=False)] == ["train.py's set_up"]


def test_the_run_forwards_nothing():
    """Run is the loop's record of what set_up built: its fields, read where they live (r.trainer.model), with
    no forwarding properties or setters that make one thing answer to two names."""
    import dataclasses

    from training.run import Run

    assert not [name for name, value in vars(Run).items() if isinstance(value, property)]
    assert {f.name for f in dataclasses.fields(Run)} >= {"trainer", "plan", "state", "checkpointer", "log"}
