"""The combination matrix: run options paired so that every two values of two factors meet in at least
one run (pairwise covering), each row a tiny real training run, checked end to end.

    python tests/matrix.py                # every row, then the table; exit 1 if any row fails
    python tests/matrix.py --list         # the rows only
    python tests/matrix.py --rows 3       # the first 3 rows (or --rows 2,5: those)
    python tests/matrix.py --seed 1       # another covering (the rows and each row's stop step)

A row that runs: the run uninterrupted; the same run stopped by SIGTERM after a seeded step k
(tests/faults.py's SMALLGPT_TEST_TERM_AFTER) and resumed in one process (a 2-rank row so resumes on the
other world size); then sample.py's greedy text from both out_dirs, which must be equal, the final weights
(bitwise), and metrics.jsonl's records (a log window of 2 steps, so that most stops fall inside one). A row whose
combination is not supported must be refused: exit non-zero, exactly one `error:` line naming the
problem, no traceback, no checkpoint written. The generator is `rows(seed)`; tests/test_matrix_rows.py
checks its covering without training anything.

Not collected by pytest (no test_ prefix): CI runs it apart, `python tests/matrix.py` (see .ci/run).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))
from errors import ArgumentParser, UserError, clipped, run_cli  # noqa: E402 (the product's one-line option errors)
from multirank_runs import two_ranks  # noqa: E402 (tests/, this script's folder)
import warm_runs  # noqa: E402

# factor -> its values; the first value of each is the plain default a refusal row starts from
FACTORS: dict[str, tuple[str, ...]] = {
    "ranks": ("1", "ddp2", "fsdp2"),
    "budget": ("off", "1h"),
    "batch": ("4", "auto"),
    "optim": ("adamw", "muon"),
    "ackpt": ("off", "on"),
    "compile": ("off", "on"),
    "dtype": ("f32", "bf16"),
    "evfull": ("off", "on"),
    "hswag": ("off", "on"),
    "tok": ("char", "gpt2", "bpe:512"),
    "init": ("scratch", "ckpt"),
    "modern": ("off", "on"),
    "show": ("off", "on"),  # eval.sample_interval and eval.inspect_interval: samples and attention maps while training
    "sft": ("off", "on"),  # fine-tuning on conversations: data.format chat (configs/sft.yaml), data/tasks.py's rows
    # train.cuda_graph with the plan's rule deciding as on a GPU (tests/faults.py's SMALLGPT_TEST_STEP_GRAPH): where
    # the row allows it, the graphed step runs uncaptured on this CPU; elsewhere the plan says why not
    "graph": ("off", "on"),
}
MAX_ITERS = 6


def refusal(row: dict[str, str]) -> str | None:
    """The error a combination must be refused with (a substring of its one line), or None: supported.
    Works on partial rows (the generator asks while it fills one in)."""
    if row.get("hswag") == "on" and row.get("tok", "gpt2") == "char":
        return "character-level tokenizer"
    return None


# graph on runs the graphed step only where the plan's rule allows it (one process, a fixed micro-batch, no compile,
# no activation checkpointing, no conversations); elsewhere the run is graph off's (the rule's exclusions are
# tests/test_graph_step.py's). So those pairs are not asked for, and a graph-on row holds these values.
GRAPH_NEEDS = {"ranks": "1", "batch": "4", "compile": "off", "ackpt": "off", "sft": "off"}


def inert(row: dict[str, str]) -> bool:
    """Whether a (partial) row sets graph on where the graphed step can't run: a pair no row needs to hold."""
    return row.get("graph") == "on" and any(row.get(f, v) != v for f, v in GRAPH_NEEDS.items())


def pairs_of(row: dict[str, str]) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    names = [n for n in FACTORS if n in row]
    return {((a, row[a]), (b, row[b])) for a, b in itertools.combinations(names, 2)}


def all_pairs() -> set[tuple[tuple[str, str], tuple[str, str]]]:
    return {((a, va), (b, vb)) for a, b in itertools.combinations(FACTORS, 2) for va in FACTORS[a] for vb in FACTORS[b]}


def rows(seed: int = 0, candidates: int = 20) -> list[dict[str, str]]:
    """Greedy pairwise covering (AETG): each new row starts from an uncovered pair and takes, factor by
    factor in a shuffled order, the value covering most new pairs; the best of `candidates` such rows is
    kept. Supported rows cover the supported pairs; each refused pair gets a row of its own: the defaults
    with that pair set (only that pair is exercised: the run stops at its one-line refusal)."""
    rng = random.Random(seed)
    refused = sorted(p for p in all_pairs() if refusal(dict(p)))
    uncovered = {p for p in all_pairs() if not inert(dict(p))} - set(refused)
    out: list[dict[str, str]] = []
    while uncovered:
        best, gain = None, -1
        for _ in range(candidates):
            (a, va), (b, vb) = rng.choice(sorted(uncovered))
            row = {a: va, b: vb}
            order = [n for n in FACTORS if n not in row]
            rng.shuffle(order)
            for n in order:
                options = [v for v in FACTORS[n] if refusal({**row, n: v}) is None and not inert({**row, n: v})]
                scores = [(len(pairs_of({**row, n: v}) & uncovered), rng.random(), v) for v in options]
                row[n] = max(scores)[2]
            row = {n: row[n] for n in FACTORS}
            g = len(pairs_of(row) & uncovered)
            if g > gain:
                best, gain = row, g
        out.append(best)
        uncovered -= pairs_of(best)
    for pair in refused:
        out.append({n: dict(pair).get(n, values[0]) for n, values in FACTORS.items()})
    return out


# ----------------------------------------------------------------------------------------- running

HELLASWAG_ITEM = {"ind": 1, "activity_label": "Baking cookies", "ctx_a": "A girl pours flour into a bowl.",
                  "ctx_b": "she", "ctx": "A girl pours flour into a bowl. she", "split": "val",
                  "split_type": "zeroshot", "label": 0, "source_id": "matrix",
                  "endings": ["stirs it with a wooden spoon.", "jumps.", "laughs loudly for a long time.", "sleeps."]}
SFT_ARGS = ("--data.format=chat",)
MODERN = ("--model.pos_embedding=rope", "--model.norm=rmsnorm", "--model.qk_norm=true", "--model.mlp_act=swiglu",
          "--model.tie_embeddings=false")


# the hub's switches are read when transformers is imported, which the runs' fork server does once
# (tests/warm_runs.py): they are this process's own before it starts
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def env_for(work: Path) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled",
           "WANDB_SILENT": "true", **OFFLINE,
           "SMALLGPT_CACHE_DIR": str(work / "choices"), "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
    if (SHARED / "tiktoken_cache").is_dir():
        env.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tiktoken_cache"))
    return env


def base_args(work: Path, tok: str, text: str = "corpus.txt") -> list[str]:
    return [f"--data.dataset={work / text}", f"--data.tokenizer={tok}", f"--data.root={work / 'data'}",
            "--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.block_size=32",
            "--model.dropout=0.0", f"--train.max_iters={MAX_ITERS}", "--train.warmup_iters=2", "--train.lr=3e-3",
            "--train.eval_interval=3", "--train.eval_iters=2", "--train.log_interval=2", "--train.device=cpu",
            "--train.peak_flops=1e11", "--wandb.mode=disabled"]


def row_args(row: dict[str, str], work: Path, native_bf16: bool) -> list[str]:
    sft = row["sft"] == "on"  # conversations: the loss on the assistant's tokens
    a = base_args(work, row["tok"], "chat.jsonl" if sft else "corpus.txt") + (list(SFT_ARGS) if sft else [])
    a += ["--train.batch_size=auto", "--train.global_batch_size=8"] if row["batch"] == "auto" else [
        "--train.batch_size=4", "--train.grad_accum_steps=2"]
    a.append(f"--train.parallel={'fsdp' if row['ranks'] == 'fsdp2' else 'ddp'}")
    a.append(f"--train.time_budget={'1h' if row['budget'] == '1h' else '0'}")
    a.append(f"--train.optimizer={row['optim']}")
    a.append(f"--train.activation_checkpointing={row['ackpt'] == 'on'}")
    a.append(f"--train.compile={row['compile'] == 'on'}")
    a.append(f"--train.cuda_graph={row['graph'] == 'on'}")
    a.append(f"--train.dtype={'bfloat16' if row['dtype'] == 'bf16' and native_bf16 else 'float32'}")
    a.append(f"--train.eval_full={row['evfull'] == 'on'}")
    if row["hswag"] == "on":
        a += [f"--eval.hellaswag_data={work / 'hellaswag.jsonl'}", "--eval.hellaswag_interval=3",
              "--eval.hellaswag_limit=4", "--eval.hellaswag_batch_size=2"]
    if row["init"] == "ckpt":
        a.append(f"--model.init_from={source_dir(work, row)}")
    if row["modern"] == "on":
        a += list(MODERN)
    if row["show"] == "on":
        a += ["--eval.sample_interval=3", "--eval.sample_tokens=8", "--eval.inspect_interval=3"]
    return a


def processes(row: dict[str, str]) -> int:
    return 1 if row["ranks"] == "1" else 2


def source_dir(work: Path, row: dict[str, str]) -> Path:
    """The run an init_from=ckpt row starts from: one per (tokenizer, model options), trained once."""
    return work / (f"source-{row['tok'].replace(':', '')}-{row['modern']}" + ("-sft" if row["sft"] == "on" else ""))


def launch(args: list[str], env: dict[str, str], ranks: int = 1, timeout: float = 240) -> tuple[int, str, str]:
    """tests/faults.py (train.py's main with the test-only hooks in env) on 1 or 2 processes forked from a warm
    interpreter (tests/warm_runs.py), 2 started as torchrun would start them (tests/multirank_runs.py's
    two_ranks: a failed rank stops the other)."""
    if ranks == 1:
        r = warm_runs.run([ROOT / "tests" / "faults.py", *args], env=env, timeout=timeout)
    else:
        r = two_ranks(args, timeout=timeout, **env)
    return r.returncode, r.stdout, r.stderr


def first_error(stdout: str, stderr: str) -> str:
    """The run's one `error:` line; else a traceback's exception line (the last unindented `Name: ...`
    line of the first exception); else the last line written."""
    lines = [re.sub(r"^\[rank\d+\]:", "", ln) for ln in stderr.splitlines()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    if errors:
        return errors[0]
    raised = [ln for ln in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b[^ ]*:? ", ln)]
    if raised:
        return raised[0][:240]
    tail = [ln for ln in lines if ln.strip()] or stdout.strip().splitlines() or ["(no output)"]
    return tail[-1][:240]


class RowFailed(Exception):
    pass


def logged(path: Path, result: tuple[int, str, str]) -> tuple[int, str, str]:
    """Keep a run's output beside its out_dir (the work dir is kept when a row fails)."""
    path.write_text(f"exit {result[0]}\n--- stdout\n{result[1]}\n--- stderr\n{result[2]}", encoding="utf-8")
    return result


def check(ok: bool, what: str, out: tuple[int, str, str] | None = None) -> None:
    if not ok:
        raise RowFailed(what + (f": rc {out[0]}, {first_error(out[1], out[2])}" if out else ""))


def greedy(out_dir: Path, env: dict[str, str]) -> str:
    r = warm_runs.run([ROOT / "sample.py", "--checkpoint", out_dir, "--prompt", "The ", "--temperature", "0",
                       "--max-new-tokens", "32", "--seed", "0", "--no-stream", "--device", "cpu", "--dtype", "float32"],
                      env=env, timeout=120)
    check(r.returncode == 0, f"sample.py {out_dir.name}", (r.returncode, r.stdout, r.stderr))
    return r.stdout


def ckpt_written(out_dir: Path) -> bool:
    return any((out_dir / n).exists() for n in ("ckpt.pt", "ckpt.dcp", "best.pt", "best.dcp"))


def run_row(i: int, row: dict[str, str], work: Path, seed: int, native_bf16: bool) -> tuple[str, str]:
    """(what was checked, result) for one row; raises RowFailed with the first error line."""
    env = {**env_for(work), **({"SMALLGPT_TEST_COMPILE_BACKEND": "aot_eager"} if row["compile"] == "on" else {}),
           **({"SMALLGPT_TEST_STEP_GRAPH": "1"} if row["graph"] == "on" else {})}
    args = row_args(row, work, native_bf16)
    ranks = processes(row)
    out = work / f"row{i:02d}"
    expected = refusal(row)
    if expected is not None:
        r = logged(Path(f"{out}-refused.log"), launch([*args, f"--train.out_dir={out}-refused"], env, ranks))
        errors = [ln for ln in r[2].splitlines() if ln.startswith("error:")]
        check(r[0] != 0, "the run was not refused", r)
        # one line (2 ranks: the same line from each rank that got to print it before the other was stopped)
        one = len(errors) == 1 if ranks == 1 else len(set(errors)) == 1
        check(one and expected in errors[0], f"expected one error line with {expected!r}", r)
        check("Traceback" not in r[2], "a traceback", r)
        check(not ckpt_written(Path(f"{out}-refused")), "a checkpoint was written before the refusal")
        return "refused in one line, no traceback, no checkpoint", "refused as expected"
    k = random.Random(f"{seed}-{i}").randint(1, MAX_ITERS - 1)
    # FSDP on 2 ranks reduce-scatters the gradients (another summation order than 1 process's
    # accumulation: last bits) and gathers bf16 weights where 1 process autocasts fp32 ones (runtime/
    # precision.py's sharded_param_dtype): a resume on 1 process differs by design, by about as much as the
    # whole run on 1 process does, which is run beside as the yardstick. Every other row: bit for bit.
    yardstick = row["ranks"] == "fsdp2"
    with ThreadPoolExecutor(3) as pool:  # the uninterrupted run and the one SIGTERM stops are independent
        full = pool.submit(launch, [*args, f"--train.out_dir={out}-full"], env, ranks)
        cut = pool.submit(launch, [*args, f"--train.out_dir={out}-resumed"], {**env, "SMALLGPT_TEST_TERM_AFTER": str(k)},
                          ranks)
        one = pool.submit(launch, [*args, f"--train.out_dir={out}-one"], env, 1) if yardstick else None
        full, cut = logged(Path(f"{out}-full.log"), full.result()), logged(Path(f"{out}-cut.log"), cut.result())
        if one is not None:
            check(logged(Path(f"{out}-one.log"), one.result())[0] == 0, "the same run on 1 process", one.result())
    check(full[0] == 0, "uninterrupted run", full)
    check(cut[0] == 0, f"run stopped by SIGTERM at {k}", cut)
    check(f"stopped by SIGTERM after iter {k};" in cut[1], f"no 'stopped by SIGTERM after iter {k}' line", cut)
    if row["graph"] == "on":  # the plan took the graphed step (a row that can't hold it is never made: inert)
        check("training step and eval forwards replayed as CUDA graphs" in full[1], "the plan did not take the graphed step", full)
    resumed = logged(Path(f"{out}-resume.log"), launch([*args, f"--train.out_dir={out}-resumed"], env, 1))
    check(resumed[0] == 0, "resume (1 process)", resumed)
    check(f"at iter {k}" in resumed[1] and "resuming" in resumed[1], f"resume did not start at iter {k}", resumed)
    with ThreadPoolExecutor(2) as pool:
        texts = list(pool.map(lambda d: greedy(d, env), [Path(f"{out}-full"), Path(f"{out}-resumed")]))
    check(texts[0] == texts[1], f"greedy texts differ: {texts[0][:40]!r} vs {texts[1][:40]!r}")
    # a tiny model's greedy text after a few steps is mostly one token repeated: the weights say more
    dw = max_dw(Path(f"{out}-full"), Path(f"{out}-resumed"))
    tol = 2 * max_dw(Path(f"{out}-full"), Path(f"{out}-one")) if yardstick else 0.0
    check(dw <= tol, f"the resumed weights differ from the uninterrupted run's by {dw:.2e} > {tol:.1e}"
          + (" (twice the 1-process run's difference)" if yardstick else " (bitwise expected)"))
    logs = same_records(Path(f"{out}-full"), Path(f"{out}-resumed"), tol=0.0 if ranks == 1 else 1e-2 if yardstick else 1e-3)
    where = "1 process" if ranks == 1 else "1 process (from 2 ranks)"
    same = "bitwise" if dw == 0 else f"max|dw| {dw:.0e} <= {tol:.0e} (2x 1-process run's)"
    return f"SIGTERM@{k}, resumed on {where}: greedy text equal, weights {same}, {logs}", "ok"


TIMING = {"tokens_per_sec", "mfu", "elapsed_s"}  # wall-time fields: another session's, naturally different


def same_records(full: Path, resumed: Path, tol: float) -> str:
    """The resumed run's metrics.jsonl logs the uninterrupted run's records (training/report/window.py: a stop
    inside a log window logs nothing partial, and the window is completed after the resume): the same steps, and
    every field but the timing ones equal, or, resumed on another world size, every number within `tol` relative
    (another summation order: 1e-3; FSDP's bf16 gathers, whose weights differ by design: 1e-2) and the samples'
    text not compared (another weight's last bit can change a sampled token). -> a clause for the row's result."""
    exact = tol == 0.0
    a, b = ([json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()] for d in (full, resumed))
    check([r["iter"] for r in a] == [r["iter"] for r in b],
          f"metrics.jsonl logs other steps: {[r['iter'] for r in a]} vs {[r['iter'] for r in b]}")
    for ra, rb in zip(a, b):
        for key in (ra.keys() | rb.keys()) - TIMING:
            va, vb = ra.get(key), rb.get(key)
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
            close = va == vb if exact or not numbers else abs(va - vb) <= tol * max(abs(va), abs(vb), 1e-12)
            check(close or (not exact and not numbers), f"metrics.jsonl at iter {ra['iter']}: {key} {va!r} vs {vb!r}")
    return f"metrics {'equal' if exact else f'within {tol:.0e}'} ({len(a)} records)"


def max_dw(a: Path, b: Path) -> float:
    """The largest difference between two runs' final weights (checkpoint.load_model: a .pt or sharded)."""
    from checkpoint import load_model

    wa, wb = (load_model(str(d)).model.state_dict() for d in (a, b))
    check(wa.keys() == wb.keys(), "the two checkpoints hold different parameters")
    return max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)


def prepare(work: Path, needed: list[dict[str, str]]) -> None:
    """The corpus (tiny shakespeare's first 60 kB), its prepared data per tokenizer, the HellaSwag items,
    and the source runs of the init_from=ckpt rows."""
    src = Path(os.environ.get("SMALLGPT_SHAKESPEARE", SHARED / "data/tinyshakespeare/input.txt"))
    (work / "corpus.txt").write_text(src.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    (work / "hellaswag.jsonl").write_text(json.dumps(HELLASWAG_ITEM) + "\n", encoding="utf-8")
    # the sft rows' conversations, and the plain text over the same characters their init_from source learns
    code = ("from pathlib import Path; from data.tasks import generate, pretrain_text, write_jsonl\n"
            f"write_jsonl(Path({str(work / 'chat.jsonl')!r}), generate(400, 4)[0])\n"
            f"Path({str(work / 'chat_text.txt')!r}).write_text(pretrain_text(400))")
    r = warm_runs.run(["-c", code], env=env_for(work), cwd=ROOT, timeout=120)
    if r.returncode:
        raise SystemExit(f"error: writing the conversations failed: {first_error(r.stdout, r.stderr)}")
    env = env_for(work)
    toks = sorted({r["tok"] for r in needed})
    chat = any(r["sft"] == "on" for r in needed)
    code = ("import sys; from data import DataConfig, prepare_data\n"
            f"for t in {toks!r}: prepare_data(DataConfig(dataset={str(work / 'corpus.txt')!r}, tokenizer=t, "
            f"root={str(work / 'data')!r}), progress=False)\n"
            f"for t in {toks if chat else []!r}: prepare_data(DataConfig(dataset={str(work / 'chat.jsonl')!r}, "
            f"tokenizer=t, format='chat', root={str(work / 'data')!r}), progress=False)")
    r = warm_runs.run(["-c", code], env=env, cwd=ROOT, timeout=300)
    if r.returncode:
        raise SystemExit(f"error: preparing the data failed: {first_error(r.stdout, r.stderr)}")
    sources = {source_dir(work, r): r for r in needed if r["init"] == "ckpt" and refusal(r) is None}

    def train_source(item):
        out, row = item
        text = "chat_text.txt" if row["sft"] == "on" else "corpus.txt"  # the conversations' characters
        a = [*base_args(work, row["tok"], text), "--train.max_iters=2", "--train.dtype=float32", f"--train.out_dir={out}",
             "--train.batch_size=4", *(MODERN if row["modern"] == "on" else ())]
        r = launch(a, env)
        if r[0]:
            raise SystemExit(f"error: the source run {out.name} failed: {first_error(r[1], r[2])}")
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(train_source, sorted(sources.items())))


def at_least_1(text: str) -> int:
    """--jobs: a pool of 0 or -2 workers was quietly one."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"takes a whole number of at least 1, got {text!r}")
    return n


def row_numbers(text: str, count: int) -> list[int]:
    """--rows K (the first K rows) or a comma list of row numbers. A K below 1 was a slice (-1: all but the
    last) or no rows at all, and no rows (0, ',') a traceback in print_table; '' and a K past the last row
    meant every row."""
    try:
        numbers = [int(x) for x in text.split(",") if x.strip()] if "," in text else list(range(1, int(text) + 1))
    except ValueError:
        raise UserError(f"--rows takes a count K of at least 1 or a comma list of row numbers (e.g. 3 or 2,5 or 7,), "
                        f"got {text!r}") from None
    if not numbers:
        raise UserError(f"--rows {text!r} names no row; give a count K of at least 1 or row numbers (e.g. 3 or 2,5)")
    if "," not in text and len(numbers) > count:  # (it was every row: a typo'd 99 ran 16 rows, silently)
        raise UserError(f"--rows {clipped(text)}: there are {count} rows; give a count K from 1 to {count}, or row "
                        f"numbers from 1 to {count} (--list shows them)")
    if "," not in text:
        return numbers
    if bad := [n for n in numbers if not 1 <= n <= count]:
        raise UserError(f"--rows: no row {bad[0]}; the rows are 1 to {count} (--list shows them)")
    return numbers


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="the covering's and the stop steps' seed (default 0)")
    p.add_argument("--rows", default=None, help="K: the first K rows; or a comma list of row numbers (1-based; "
                   "one row: N,)")
    p.add_argument("--list", action="store_true", help="print the rows and exit")
    p.add_argument("--jobs", type=at_least_1, default=2, help="rows run at once (default 2)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (printed)")
    a = p.parse_args(argv)
    table = rows(a.seed)
    numbers = row_numbers(a.rows, len(table)) if a.rows is not None else list(range(1, len(table) + 1))
    if a.list:
        print_table(table, numbers, {})
        return 0
    from runtime.precision import cpu_native_bf16

    native = cpu_native_bf16()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="smallgpt-matrix-"))
    os.environ.update(OFFLINE)
    try:
        prepare(work, [table[n - 1] for n in numbers])
        print(f"prepared data and source runs in {time.perf_counter() - started:.0f} s", flush=True)
        results: dict[int, tuple[str, str, float]] = {}

        def one(n: int) -> None:
            t0 = time.perf_counter()
            try:
                checked, result = run_row(n, table[n - 1], work, a.seed, native)
            except RowFailed as e:
                checked, result = "", f"FAIL {e}"
            except subprocess.TimeoutExpired as e:
                checked, result = "", f"FAIL timed out after {e.timeout:.0f} s"
            results[n] = (checked, result, time.perf_counter() - t0)
            print(f"row {n}: {result} ({results[n][2]:.0f} s)", flush=True)
        with ThreadPoolExecutor(a.jobs) as pool:
            list(pool.map(one, numbers))
        print()
        print_table(table, numbers, results, native)
        ran = [table[n - 1] for n in numbers if results[n][1] == "ok"]
        refused = [table[n - 1] for n in numbers if results[n][1] == "refused as expected"]
        covered = set().union(*map(pairs_of, ran)) | {p for r in refused for p in pairs_of(r) if refusal(dict(p))}
        asked = {p for p in all_pairs() if not inert(dict(p))}
        print(f"pairs covered: {len(covered & asked)} / {len(asked)} ({len(all_pairs()) - len(asked)} not asked: graph on "
              f"where the graphed step can't run); wall time {time.perf_counter() - started:.0f} s")
        failed = [n for n in numbers if results[n][1].startswith("FAIL")]
        if failed:
            print(f"{len(failed)} row(s) failed: {', '.join(map(str, failed))} (work dir {work}, kept)")
            a.keep = True
        return 1 if failed else 0
    finally:
        if a.keep:
            print(f"work dir: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def print_table(table: list[dict[str, str]], numbers: list[int], results: dict, native: bool = True) -> None:
    heads = ["#", *FACTORS, "checked", "result", "s"]
    lines = []
    for n in numbers:
        row = dict(table[n - 1])
        if not native and row["dtype"] == "bf16":
            row["dtype"] = "bf16>f32"
        checked, result, secs = results.get(n, ("", "", None))
        lines.append([str(n), *row.values(), checked or ("refusal" if refusal(table[n - 1]) else "run"), result,
                      "" if secs is None else f"{secs:.0f}"])
    widths = [max(len(h), *(len(ln[i]) for ln in lines)) for i, h in enumerate(heads[:-3])]
    for ln in [heads] + lines:
        print("  ".join(c.ljust(w) for c, w in zip(ln, widths)) + "  " + "  ".join(ln[-3:]))
    print("legend: ranks 1 = one process, ddp2/fsdp2 = 2 gloo ranks (resumed on 1 process); budget 1h = "
          "train.time_budget large enough to keep max_iters; compile on = torch.compile with backend aot_eager "
          "(tests/faults.py's SMALLGPT_TEST_COMPILE_BACKEND: Dynamo + AOTAutograd, no Inductor C++ builds); "
          "init ckpt = model.init_from a 2-step run of the same tokenizer and model options; modern = rope, rmsnorm, "
          "qk_norm, swiglu, untied head; show on = samples (8 tokens) and attention maps every 3 steps; sft on = "
          "data.format chat on data/tasks.py's conversations (init ckpt: a source run on their plain text); graph on = "
          "train.cuda_graph with the plan deciding as on a GPU (the graphed step, uncaptured on this CPU); weights: the resumed run's final weights against the uninterrupted run's, bitwise, "
          "but for fsdp2 rows within twice the difference of the same run on 1 process (FSDP's numerics differ across "
          "world sizes by design); metrics: the resumed run's metrics.jsonl against the uninterrupted run's, every field but wall time (log_interval 2: a stop inside a window logs nothing partial), numbers within 1e-3 for ddp2 rows and 1e-2 for fsdp2 rows (samples not compared there); greedy text: sample.py --temperature 0, 32 tokens, float32" + ("" if native else "; bf16>f32: this CPU has no native bf16, so the "
                                            "row ran float32"))


if __name__ == "__main__":
    run_cli(main)
