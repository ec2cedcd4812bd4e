"""The docs hold together: every relative link of the Markdown files (README.md, docs/, the folders' READMEs)
reaches a file that is there and, with an anchor, a heading of that file, and the code they name is there.
The references: the files, their headings and the code itself."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ relative links and their anchors

def markdown_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    files = [ROOT / p for p in tracked] or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [f for f in files if f.is_file() and "fixtures" not in f.parts]


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (a link or a '#' there is code, not Markdown)."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (letters, digits, _ and - stay), spaces
    to hyphens."""
    heading = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file has: its headings' slugs (a repeated one gets -1, -2, ...), and HTML ids."""
    text = re.sub(r"^(```|~~~).*?^\1", "", path.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    found = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    for heading in re.findall(r"^#{1,6} (.+?)#*$", text, re.M):
        s = slug(heading)
        found.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return found


def relative_links(path: Path) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", prose(path.read_text())) if not re.match(r"[a-z]+:", t)]


LINKS = [(md, target) for md in markdown_files() for target in relative_links(md)]


def test_the_link_check_sees_the_docs_links():
    assert len(LINKS) > 40 and any(t.startswith("#") for _, t in LINKS) and any("#" in t[1:] for _, t in LINKS)
    assert slug("Serving: `python serve.py` under load") == "serving-python-servepy-under-load"


@pytest.mark.parametrize("md,target", LINKS, ids=[f"{m.relative_to(ROOT)}->{t}" for m, t in LINKS])
def test_every_relative_link_reaches_a_file_and_its_anchor(md, target):
    """Before: docs/sampling.md linked performance.md#gpu-ready-not-yet-measured-issue-24, a heading
    performance.md no longer has."""
    file, _, anchor = target.partition("#")
    dest = (md.parent / file).resolve() if file else md
    where = md.relative_to(ROOT)
    assert dest.exists(), f"{where}: the link ({target}) names {file}, which is not there"
    if anchor:
        assert dest.suffix == ".md", f"{where}: the link ({target}) has an anchor into a file that is not Markdown"
        assert anchor in anchors(dest), f"{where}: the link ({target}): {dest.relative_to(ROOT)} has no heading #{anchor}"


# ------------------------------------------------------------------ code the docs name

FILE_REF = re.compile(r"`((?:[a-z_]+/)+[a-z_0-9]+\.py)`")
NAME_REF = re.compile(r"`((?:[a-z_]+/)+[a-z_0-9]+)\.([A-Za-z_][A-Za-z0-9_]*)`")
ELSEWHERE = {"data/shakespeare/prepare.py"}  # nanoGPT's, named in docs/performance.md's comparison


def code_references(md: Path, text: str) -> list[str]:
    """The code a Markdown file names in backticks that is not there: a `package/file.py` that is no file (of
    the repo, or beside the Markdown file, or the tail of a tracked path: `remote_code/modeling_smallgpt.py`
    under checkpoint/), and a `package/module.name` whose module (a file or a package's __init__.py) is
    gone or does not define the name."""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    missing = []
    for path in FILE_REF.findall(text):
        if path not in ELSEWHERE and not ((ROOT / path).is_file() or (md.parent / path).is_file()
                                          or any(t.endswith("/" + path) for t in tracked)):
            missing.append(path)
    for module, name in NAME_REF.findall(text):
        if name in ("py", "yaml", "json", "jsonl", "md", "txt", "png", "html", "pt", "dcp", "sh", "toml"):
            continue
        source = next((p for p in (ROOT / f"{module}.py", ROOT / module / "__init__.py") if p.is_file()), None)
        if source is None or not re.search(rf"^(?:(?:async )?def|class)\s+{name}\b|^{name}\s*(?::[^=]*)?=",
                                           source.read_text(encoding="utf-8"), re.M):
            missing.append(f"{module}.{name}")
    return missing


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_code_a_doc_names_is_there(md):
    """Before: docs/reliability.md's class 7 row cited checkpoint/run.py (split into out_dir.py, resume.py and
    checkpointer.py) and class 4 training/config.resume_conflicts (now training/config/sections.py)."""
    missing = code_references(md, md.read_text())
    assert not missing, f"{md.relative_to(ROOT)} names code that is not there: {missing}"
    old = "`checkpoint/run.py`, `training/config.resume_conflicts`, `training/builders.config_of_source`"
    assert code_references(md, old) == ["checkpoint/run.py", "training/config.resume_conflicts"]
