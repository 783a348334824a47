"""``docs/architecture.md``'s module map (the code block under "## Architecture") against
``src/headwise``: every module and package is named there, and every ``.py``/``.toml`` name or
folder the map mentions exists, so the map goes stale in neither direction.

How the map reads: ``src/headwise/`` heads it; a line indented 2 (4) spaces starts an entry of
the package (of the last 2-space folder, ``families/``), and deeper lines continue it. An entry
that starts with ``folder/`` is about that folder; one that starts with file names is about the
folder it sits in. A name in an entry is read in the entry's folder, else anywhere below it
(``tensorboard.py`` in ``train/`` is ``train/trackers/tensorboard.py``); ``a/b.py`` is read from
the entry's folder; a name may be a pattern (``attention_*.py``, ``search-*.toml``).
"""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
SRC = Path(__file__).resolve().parent.parent / "src" / "headwise"

# a file name, pattern or relative path ending in .py/.toml (run outputs such as spec.json are not
# the source tree's); a folder is a word then "/" with no word or path after it ("local/Ray" is not)
FILE = re.compile(r"(?<![\w/.*-])([\w*-]+(?:/[\w*-]+)*\.(?:py|toml))\b")
FOLDER = re.compile(r"(?<![\w/])([a-z_]+)/(?![\w*/])")


def module_map(doc: str) -> str:
    """The code block of the doc's "## Architecture" section."""
    section = doc.split("\n## Architecture\n", 1)[1]
    return section.split("```\n", 2)[1]


def map_entries(block: str) -> list[tuple[Path, str]]:
    """``(folder relative to src/headwise, text)`` per entry of the map, the text holding what the
    entry names (a leading ``folder/`` is the entry's folder, not part of its text)."""
    lines = block.splitlines()
    assert lines[0] == "src/headwise/", lines[0]
    entries: list[tuple[Path, str]] = []
    top = Path(".")  # the last 2-space folder: where a 4-space entry sits
    for line in lines[1:]:
        indent = len(line) - len(line.lstrip())
        if indent >= 8:  # continues the entry above
            folder, text = entries[-1]
            entries[-1] = (folder, f"{text} {line.strip()}")
            continue
        assert indent in (2, 4), f"unexpected indent: {line!r}"
        parent = Path(".") if indent == 2 else top
        head, _, rest = line.strip().partition(" ")
        if head.endswith("/"):
            folder = parent / head.rstrip("/")
            if indent == 2:
                top = folder
            entries.append((folder, rest))
        else:
            entries.append((parent, line.strip()))
    return entries


def resolve(root: Path, folder: Path, name: str) -> list[Path]:
    """What ``name`` (file, pattern or folder) in an entry about ``folder`` names under ``root``."""
    base = root / folder
    if "/" in name.rstrip("/"):
        return sorted(base.glob(name.rstrip("/")))
    direct = sorted(base.glob(name.rstrip("/")))
    return direct or sorted(p for p in base.rglob(name.rstrip("/")) if p.parent != base)


def map_problems(block: str, root: Path) -> tuple[list[str], list[str]]:
    """``(missing, stale)``: the modules and packages under ``root`` the map names nowhere, and the
    names the map mentions that match nothing (each as ``folder: name``)."""
    named: set[Path] = set()
    stale: list[str] = []
    for folder, text in map_entries(block):
        if not (root / folder).is_dir():
            stale.append(f"{folder.as_posix()}/")
            continue
        named.add(root / folder)
        for name in FILE.findall(text) + [f"{f}/" for f in FOLDER.findall(text)]:
            found = resolve(root, folder, name)
            if not found:
                stale.append(f"{folder.as_posix()}: {name}")
            named.update(found)
    wanted = {p for p in root.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    wanted |= {p.parent for p in root.rglob("__init__.py") if p.parent != root}
    missing = sorted(p.relative_to(root).as_posix() for p in wanted - named)
    return missing, stale


def test_the_map_names_every_module_and_only_what_exists():
    missing, stale = map_problems(module_map(DOC.read_text()), SRC)
    assert missing == [], f"docs/architecture.md's module map does not name: {missing}"
    assert stale == [], f"docs/architecture.md's module map names what does not exist: {stale}"


def test_the_map_is_read_entry_by_entry():
    entries = map_entries(module_map(DOC.read_text()))
    # a 4-space entry sits in families/, a file-name entry in the package root
    assert any(folder == Path("families/lm") and "report_heads.py" in text for folder, text in entries)
    assert any(folder == Path(".") and text.startswith("registry.py") for folder, text in entries)
    assert resolve(SRC, Path("train"), "tensorboard.py") == [SRC / "train" / "trackers" / "tensorboard.py"]
    # found in the entry's own folder first: the root's config.py is not train/config.py
    assert resolve(SRC, Path("."), "config.py") == [SRC / "config.py"]


def test_a_missing_module_and_a_stale_name_are_both_reported(tmp_path):
    for path in ("pkg/__init__.py", "pkg/a.py", "pkg/b_one.py", "pkg/sub/__init__.py", "pkg/sub/deep.py",
                 "top.py", "other/__init__.py", "other/c.py", "other/study.toml"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    block = ("src/headwise/\n"
             "  top.py        the top (writes out.json, runs local/Ray)\n"
             "  pkg/          a.py, b_*.py, sub/ (deep.py),\n"
             "                gone.py\n"
             "    sub/        deep.py\n")
    # other/ and its c.py are named nowhere; gone.py is; out.json and local/Ray are not files
    assert map_problems(block, tmp_path) == (["other", "other/c.py"], ["pkg: gone.py"])
    block += "  other/        c.py, study.toml, nothere/\n"
    assert map_problems(block, tmp_path) == ([], ["pkg: gone.py", "other: nothere/"])
