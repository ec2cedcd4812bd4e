"""Shared test set-up: offline assets from ../shared, and small helpers."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))

# Tests never touch the network: point tiktoken and the shakespeare source at the local copies.
if (SHARED / "tiktoken_cache").is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tiktoken_cache"))
if (SHARED / "data/tinyshakespeare/input.txt").is_file():
    os.environ.setdefault("SMALLGPT_SHAKESPEARE", str(SHARED / "data/tinyshakespeare/input.txt"))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# hypothesis: a small, fixed set of examples in CI (the same on every run, so a failure reproduces), more
# by hand with HYPOTHESIS_PROFILE=dev. No deadline: a shared 2-core machine makes timings erratic.
from hypothesis import HealthCheck, settings  # noqa: E402

from code_reading import ENTRY_SCRIPTS  # noqa: E402 (run, never imported)
from cuda_graphs import fake_cuda_graphs  # noqa: E402,F401 (a fixture: CUDA graphs emulated on the CPU)

settings.register_profile("ci", derandomize=True, max_examples=20, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("dev", max_examples=300, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))




def pytest_collection_finish(session):
    """What collection made (torch, transformers and the test modules, imported) moves to the collector's
    permanent generation (gc.freeze): it lives until the end anyway, and every full collection in a test walked
    it, 0.5 s each, 20 a worker (measured on a 2-core EPYC Zen 3). What the tests make is collected as before."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def own_choice_cache(tmp_path_factory, monkeypatch):
    """Each test gets an empty cache of measured choices (runtime/choices.py), never the user's: a
    choice cached by one test must not decide another's (subprocesses inherit the variable)."""
    monkeypatch.setenv("SMALLGPT_CACHE_DIR", str(tmp_path_factory.mktemp("choices")))


@pytest.fixture(autouse=True)
def no_entry_script_imported():
    """A test that imports an entry script (by any means: importlib with a name from a table too, which no
    reading of the code sees) fails, named: import its command's module instead (tests/test_architecture.py)."""
    yield
    scripts = [m for m in ENTRY_SCRIPTS
               if Path(getattr(sys.modules.get(m), "__file__", None) or "/").resolve() == ROOT / f"{m}.py"]
    for m in scripts:
        del sys.modules[m]  # the next test starts clean: only the importer fails
    if scripts:
        pytest.fail(f"the test imported the entry script(s) {scripts}: import the command's module instead "
                    "(training.cli, inference.sample_cli, inference.chat_cli, server.cli, benchmarks.cli)")


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    # tests run tiny ops, where a second OpenMP thread costs more than it gives, and on a shared
    # 2-core machine it makes timings erratic
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    p = Path(os.environ["SMALLGPT_SHAKESPEARE"])
    assert p.is_file(), f"tiny shakespeare not found at {p}"
    return p


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """Tiny shakespeare, char-tokenized and prepared once per test process: the tiny training runs' data
    (read only: a test that changes prepared data prepares its own)."""
    from data import DataConfig, prepare_data

    root = tmp_path_factory.mktemp("prepared")
    prepare_data(DataConfig(tokenizer="char", root=str(root)), progress=False)
    return root


@pytest.fixture(scope="session")
def world(data_root):
    """The hostile tests' shared inputs: tests/hostile_world.py's build_world."""
    from hostile_world import build_world

    yield from build_world(data_root)
