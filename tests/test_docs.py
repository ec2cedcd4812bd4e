"""The docs hold together: every relative link of the Markdown files (README.md, docs/, the folders' READMEs)
reaches a file that is there and, with an anchor, a heading of that file; the code they name is there; and
configs/README.md lists every config key with its default. The references: the files, their headings, the code
itself and the config's dataclass fields."""
from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from training.config.sections import Config

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


# ------------------------------------------------------------------ configs/README.md's keys

def _cells(row: str) -> list[str]:
    """A Markdown table row's cells (an escaped pipe, `\\|`, stays inside its cell)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def documented_keys() -> dict[str, dict[str, str]]:
    """{section: {key: the default shown}} from configs/README.md's tables, each under its **section** label.
    A row may name several keys (`lr`, `min_lr`) with as many defaults (1e-3, 1e-4)."""
    text = (ROOT / "configs" / "README.md").read_text()
    found: dict[str, dict[str, str]] = {}
    for label in re.finditer(r"^\*\*(\w+)\*\*:", text, re.M):
        rest = text[label.end():]
        span = rest[:min([m.start() for m in re.finditer(r"^(\*\*\w+\*\*:|#)", rest, re.M)] + [len(rest)])]
        rows = {}
        for line in span.splitlines():
            if not line.startswith("| `"):
                continue
            cells = _cells(line)
            keys = re.findall(r"`(\w+)`", cells[0])
            defaults = [d.strip() for d in cells[1].split(",")] if len(keys) > 1 else [cells[1]]
            assert len(defaults) == len(keys), f"configs/README.md: {line!r} names {len(keys)} keys, {len(defaults)} defaults"
            rows.update(zip(keys, defaults))
        found[label.group(1)] = rows
    return found


def _shows(cell: str, default) -> bool:
    cell = cell.strip("`").strip()
    if isinstance(default, bool):
        return cell.lower() == str(default).lower()
    if isinstance(default, (int, float)):
        try:
            return float(cell) == default
        except ValueError:
            return False
    if isinstance(default, list):
        return yaml.safe_load(cell) == default
    return (cell if cell not in ('""', "''") else "") == default


SECTIONS = [(s.name, f.name, getattr(getattr(Config(), s.name), f.name))
            for s in dataclasses.fields(Config) for f in dataclasses.fields(getattr(Config(), s.name))]


@pytest.mark.parametrize("section,key,default", SECTIONS, ids=[f"{s}.{k}" for s, k, _ in SECTIONS])
def test_configs_readme_lists_every_key_with_its_default(section, key, default):
    """Before: the train table left out global_batch_size, cuda_graph, float8, parallel,
    activation_checkpointing, eval_full and time_budget, which --help lists."""
    documented = documented_keys()
    assert key in documented.get(section, {}), f"configs/README.md's **{section}** table has no row for `{key}`"
    assert _shows(documented[section][key], default), (section, key, documented[section][key], default)


def test_configs_readme_lists_no_key_the_config_lacks():
    fields = {s: {k for s2, k, _ in SECTIONS if s2 == s} for s, _, _ in SECTIONS}
    for section, keys in documented_keys().items():
        assert section in fields and keys.keys() <= fields[section], (section, sorted(keys.keys() - fields.get(section, set())))


# ------------------------------------------------------------------ the layouts: README's table, architecture.md's tree

def tracked(pattern: str = "*") -> list[str]:
    return subprocess.run(["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True).stdout.split()


def layout_tree(text: str) -> set[str]:
    """The paths docs/architecture.md's layout block names: a line's indent (two spaces a level) puts its name in
    the folder named last one level up."""
    block = re.search(r"^## The layout, one line per folder and file\n.*?^```\n(.*?)^```", text, re.M | re.S)
    assert block, "docs/architecture.md has no layout block"
    names, folders = set(), []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        assert depth <= len(folders), f"docs/architecture.md: {line.split()[0]!r} is indented under no folder"
        path = "".join(folders[:depth]) + line.split()[0]
        folders[depth:] = [line.split()[0]] if path.endswith("/") else []
        names.add(path)
    return names


def test_the_architecture_layout_names_every_module_where_it_is():
    """Before: server/ (six modules) was not in the layout, training/'s rooms' files were, and
    modeling_smallgpt.py stood under checkpoint/ without its folder remote_code/."""
    listed = layout_tree((ROOT / "docs" / "architecture.md").read_text())
    modules = {p for p in tracked("*.py") if not p.startswith("tests/") and not p.endswith("/__init__.py")}
    folders = {p.rsplit("/", 1)[0] + "/" for p in modules if "/" in p}
    assert not (modules | folders) - listed, f"docs/architecture.md's layout lacks {sorted((modules | folders) - listed)}"
    assert not listed - modules - folders, f"docs/architecture.md's layout names what is not there: {sorted(listed - modules - folders)}"
    nested = "## The layout, one line per folder and file\n```\nx/\n  r/   a room\n    m.py   one\n  a.py   two\nb.py\n```"
    assert layout_tree(nested) == {"x/", "x/r/", "x/r/m.py", "x/a.py", "b.py"}


def test_the_readme_layout_names_every_top_level_part():
    """Before: the README's layout named `train.py`, `sample.py` as "the two entry points" (chat.py and serve.py
    were missing) and had no row for server/."""
    text = (ROOT / "README.md").read_text()
    table = re.search(r"^## Layout\n(.*?)^## ", text, re.M | re.S)
    assert table, "README.md has no ## Layout section"
    named = {name.rstrip("/") for row in table.group(1).splitlines() if row.startswith("| `")
             for name in re.findall(r"`([^`]+)`", _cells(row)[0])}
    top = {p.split("/")[0] for p in tracked() if not p.startswith(".")}
    parts = {p for p in top if p.endswith(".py") or (ROOT / p).is_dir()}
    assert not parts - named, f"README.md's layout table lacks {sorted(parts - named)}"
