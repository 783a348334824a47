"""The README and the docs/ pages stay true to the repository: their links and images resolve
(anchors included, GitHub-style), every `headwise ...` command they show parses with headwise's
own argument parser (nothing is run), the benchmark scripts they name exist, and the README stays
a front page."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import unicodedata
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 160
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
IDS = [str(page.relative_to(ROOT)) for page in PAGES]

FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target) and ![alt](target); the target may be followed by a "title"
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_SRC = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.I)
INLINE_CODE = re.compile(r"(`+)(?:.+?)\1", re.S)


def prose_lines(text: str, keep_inline_code: bool = False) -> list[tuple[int, str]]:
    """(line number, line) for every line outside fenced code blocks, inline code removed unless
    ``keep_inline_code``."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line if keep_inline_code else INLINE_CODE.sub("", line)))
    return out


def code_blocks(text: str, language: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of every fenced block tagged ``language``."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match and current is None:
            tag = line.strip()[3:].strip().lower()
            current, start = ([] if tag == language else False), number + 1
        elif match:
            if current is not False:
                blocks.append((start, current))
            current = None
        elif current not in (None, False):
            current.append(line)
    return blocks


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: link text kept, markup and punctuation dropped,
    lower case, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = [ch for ch in text
            if ch in " -_" or unicodedata.category(ch)[0] in "LN"]
    return "".join(kept).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    """Every heading anchor of a markdown file, numbered as GitHub numbers repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text(), keep_inline_code=True):
        match = re.match(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(out)


def link_problems(page: Path, root: Path = ROOT) -> list[str]:
    """Every relative link or image of ``page`` that does not resolve, as 'line N: target: why'."""
    text = page.read_text()
    problems = []
    for number, line in prose_lines(text):
        targets = LINK.findall(line) + HTML_SRC.findall(line)
        for target in targets:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            resolved = (page.parent / path_part).resolve() if path_part else page
            where = f"line {number}: {target}"
            if not resolved.is_relative_to(root):
                problems.append(f"{where}: points outside the repository")
            elif not resolved.exists():
                problems.append(f"{where}: no such file")
            elif anchor:
                if resolved.suffix != ".md" or resolved.is_dir():
                    problems.append(f"{where}: an anchor into a file that is not markdown")
                elif anchor not in anchors(resolved):
                    problems.append(f"{where}: no heading with anchor #{anchor} in {resolved.name}")
    return problems


def shell_commands(page: Path) -> list[tuple[int, list[str]]]:
    """(line number, argv) of every command line in the page's ```bash blocks: ``\\`` continuations
    joined, ``# comments`` dropped, leading ``VAR=value`` assignments skipped."""
    out = []
    for start, lines in code_blocks(page.read_text(), "bash"):
        pending, first = "", None
        for offset, line in enumerate(lines):
            if first is None:
                first = start + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            joined, pending = pending + line, ""
            number, first = first, None
            try:
                argv = shlex.split(joined, comments=True)
            except ValueError as exc:
                out.append((number, ["<unparsable shell line>", f"{joined!r}: {exc}"]))
                continue
            while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
                argv = argv[1:]
            if argv:
                out.append((number, argv))
    return out


def headwise_argv(argv: list[str]) -> list[str] | None:
    """The arguments after ``headwise`` if the line runs headwise (directly, ``python3 -m
    headwise`` or ``torchrun ... -m headwise``), else None."""
    if argv[0] == "headwise":
        return argv[1:]
    if "-m" in argv:
        i = argv.index("-m")
        if i + 1 < len(argv) and argv[i + 1] == "headwise":
            return argv[i + 2:]
    return None


@pytest.fixture(scope="module")
def parser():
    from headwise.cli import build_parser

    return build_parser()


def parse_error(parser, args: list[str]) -> str | None:
    """None if headwise's parser accepts ``args``, else what it said. Nothing is run."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return stderr.getvalue().strip() or f"exit status {exc.code}"
    return None


def test_the_docs_pages_exist_and_the_readme_and_the_index_link_every_one():
    pages = {page.name for page in PAGES if page.parent.name == "docs"}
    assert {"index.md", "install.md", "models.md", "data.md", "training.md", "studies.md", "analysis.md",
            "huggingface.md", "findings.md", "speed.md", "architecture.md"} <= pages
    readme, index = (ROOT / "README.md").read_text(), (ROOT / "docs" / "index.md").read_text()
    for name in sorted(pages):
        assert f"(docs/{name}" in readme, f"README.md does not link docs/{name}"
        if name != "index.md":
            assert f"({name}" in index, f"docs/index.md does not link {name}"


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move reference text into docs/")


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_links_and_images_resolve(page):
    problems = link_problems(page)
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_headwise_commands_parse(page, parser):
    problems = []
    for number, argv in shell_commands(page):
        args = headwise_argv(argv)
        if args is None:
            continue
        error = parse_error(parser, args)
        if error:
            problems.append(f"line {number}: {shlex.join(argv)}\n    {error}")
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_benchmark_scripts_named_exist(page):
    problems = []
    for number, argv in shell_commands(page):
        if argv[0] in ("python", "python3") and len(argv) > 1 and argv[1].startswith("benchmarks/"):
            if not (ROOT / argv[1]).is_file():
                problems.append(f"line {number}: {argv[1]} does not exist")
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_the_checks_catch_what_they_are_for(tmp_path, parser):
    """The helpers fail on a broken link, a missing anchor and an unknown option."""
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## Some `code` heading\n\n[ok](#some-code-heading) [bad](#nope) "
                    "[gone](no-such-file.md)\n\n```bash\nheadwise plan --no-such-option   # a comment\n"
                    "headwise study progression \\\n    --preset quick\n```\n")
    assert anchors(page) == {"a-page", "some-code-heading"}
    problems = link_problems(page, root=tmp_path)
    assert len(problems) == 2 and "#nope" in problems[0] and "no-such-file.md: no such file" in problems[1]
    commands = shell_commands(page)
    assert [argv for _, argv in commands] == [["headwise", "plan", "--no-such-option"],
                                              ["headwise", "study", "progression", "--preset", "quick"]]
    assert parse_error(parser, commands[0][1][1:]) and parse_error(parser, commands[1][1][1:]) is None
    assert github_slug("Hugging Face models, lm-evaluation-harness, experiment trackers") == \
        "hugging-face-models-lm-evaluation-harness-experiment-trackers"
    assert github_slug("MFU and the machine's peak") == "mfu-and-the-machines-peak"
