"""The commands README.md and docs/*.md show, extracted for tests/test_class6_documented_commands.py.

Extraction: every fenced block whose language is bash, sh, shell or console in README.md, configs/README.md
and docs/*.md
(a new doc is covered when it lands); a line ending in `\\` continues on the next; `# ...` comments go;
bash's $'...' is decoded (so `--text $'ROMEO:\\nBut soft'` holds a newline, as in bash); `a && b` and
`a; b` are two commands; `echo TEXT | cmd` gives cmd TEXT on stdin, as `printf 'FORMAT' | cmd` does; `cmd | tee FILE` drops the tee;
`cmd > FILE` writes cmd's stdout to FILE; `VAR=value cmd` and `export VAR=value` set the environment;
a timing wrapper (`/usr/bin/time -f FMT`) is dropped. Unlabelled blocks are output, not commands.

Skipped, each by a rule with its reason (SKIP_RULES): what needs a GPU, the network, other machines or
minutes by design. Everything else runs, with the substitutions of SUBSTITUTIONS (test_class6's docstring).
"""
from __future__ import annotations

import codecs
import dataclasses
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\s*$")
COMMAND_LANGS = {"bash", "sh", "shell", "console"}

# (pattern searched in the command as written, why it is not run here): the first match wins
SKIP_RULES: list[tuple[str, str]] = [
    (r"^pip install", "installs packages from the network (CI installs requirements-dev.txt itself)"),
    (r"-m pytest", "the test suite itself, of which this test is one"),
    (r"^torchrun", "8 GPUs or several nodes (tests/test_multirank.py runs train.py under torchrun on 2 CPU ranks)"),
    (r"^lm_eval", "lm-evaluation-harness, an external tool that is not installed here (and downloads its data)"),
    (r"--device cuda|--train\.float8|--train\.compile=true|benchmarks\.auto_batch",
     "needs a CUDA GPU (the device machine's runs, docs/performance.md)"),
    (r"bench\.py", "a benchmark: minutes of measuring by design (tests/test_bench.py runs bench.py --quick)"),
    (r"^rm ", "removes folders outside any sandbox (~/.cache/smallgpt): a benchmark's fresh start"),
    (r"eval\.hellaswag(?!.*--data)", "downloads HellaSwag from the HF hub (the network)"),
    (r"serve\.py", "a server: it runs until stopped (its own tests start and stop it)"),
    (r"--model\.init_from=gpt2\b", "fine-tunes the HF hub's GPT-2 (the network; tests/test_sft.py fine-tunes a local HF GPT-2 folder)"),
    (r"^curl .*127\.0\.0\.1", "a request to a running serve.py (tests/test_serve.py sends each kind to a real server)"),
]


@dataclasses.dataclass
class Command:
    doc: str  # "docs/sampling.md"
    line: int  # where the command starts in it
    shown: str  # the command as the doc shows it (one line, comments gone)
    argv: list[str]  # the words of the command to run, the program first
    stdin: str | None = None
    stdout_to: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    skip: str | None = None  # the rule's reason

    def __str__(self) -> str:
        return f"{self.doc}:{self.line} {self.shown}"


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "configs" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[tuple[int, str]]:
    """(line number, the command's text) of every command line in `path`'s fenced command blocks."""
    out, lang, pending, start = [], None, "", 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            lang = None if lang is not None else fence.group(1)
            continue
        if lang not in COMMAND_LANGS:
            continue
        if not pending:
            start = number
        pending += line
        if pending.rstrip().endswith("\\"):
            pending = pending.rstrip()[:-1] + " "
            continue
        if pending.strip() and not pending.strip().startswith("#"):
            out.append((start, pending.strip()))
        pending = ""
    return out


COMMAND_WORDS = re.compile(r"^(python3?|torchrun|pip|curl|bash|printf|echo) ")


def unlabelled_commands(path: Path) -> list[str]:
    """Lines of blocks that are not command blocks which read as commands: such a block is never run, so the
    command in it could rot unseen (the plot commands of docs/training.md did: `--out figs/` wrote figs.png).
    A transcript's `$ python ...` is output, as is a block of another language (yaml, python)."""
    found, lang = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            lang = None if lang is not None else fence.group(1)
        elif lang == "" and COMMAND_WORDS.match(line):
            found.append(f"{path.name}:{number}: {line[:60]}")
    return found


def _ansi_c(text: str) -> str:
    """bash's $'...' quoting, decoded and quoted again for shlex."""
    def decode(m: re.Match) -> str:
        return shlex.quote(codecs.decode(m.group(1), "unicode_escape"))
    return re.sub(r"\$'((?:[^'\\]|\\.)*)'", decode, text)


def _words(text: str) -> list[str]:
    lex = shlex.shlex(_ansi_c(text), posix=True, punctuation_chars=";&|>")
    lex.whitespace_split = True
    return list(lex)


def commands(path: Path) -> list[Command]:
    doc = str(path.relative_to(ROOT))
    out, env = [], {}
    for line, text in blocks(path):
        words = _words(text)
        parts, current = [], []
        for w in words + [";"]:
            if w in (";", "&&", "|", ">"):
                parts.append((current, w))
                current = []
            else:
                current.append(w)
        stdin = None
        i = 0
        while i < len(parts):
            argv, sep = parts[i]
            i += 1
            if not argv:
                continue
            if argv[0] == "export":  # the environment of the commands after it
                env.update(dict(a.split("=", 1) for a in argv[1:] if "=" in a))
                continue
            if argv[0] == "echo" and sep == "|":
                stdin = " ".join(argv[1:]) + "\n"
                continue
            if argv[0] == "printf" and sep == "|" and len(argv) == 2 and "%" not in argv[1]:  # a format alone
                stdin = codecs.decode(argv[1], "unicode_escape")
                continue
            if argv[0] == "tee":
                continue
            prefix = {}
            while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
                key, value = argv.pop(0).split("=", 1)
                prefix[key] = value
            if argv[:1] == ["/usr/bin/time"]:
                argv = argv[3:] if argv[1:2] == ["-f"] else argv[1:]
            stdout_to = None
            if sep == ">" and i < len(parts):
                stdout_to = parts[i][0][0]
                i += 1
            raw = " ".join(argv)
            skip = next((why for pattern, why in SKIP_RULES if re.search(pattern, raw)), None)
            shown = " ".join(shlex.quote(w) for w in argv) + (f" < {stdin.strip()!r}" if stdin else "") + \
                (f" > {stdout_to}" if stdout_to else "")
            out.append(Command(doc, line, shown, argv, stdin, stdout_to, {**env, **prefix}, skip))
            stdin = None
    return out


def all_commands() -> list[Command]:
    return [c for doc in documents() for c in commands(doc)]
