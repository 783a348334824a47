"""The tables of registered parts are generated, not hand-kept: ``docs/parts.md`` is exactly what
``headwise parts`` prints for headwise's own registries (so it cannot go stale), ``--check`` says
when a page is stale and how to regenerate it, and the cells read cleanly from the docstrings.
That a family's parts appear in the tables once it is installed is checked by
``tests/test_toy_family.py``."""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

from headwise.cli import main
from headwise.commands.parts import REGENERATE, markdown_table, summary

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "parts.md"


def test_the_committed_page_is_what_headwise_parts_prints():
    # a fresh process: parts that other tests register in this one (a toy attention kind) stay out
    done = subprocess.run([sys.executable, "-m", "headwise", "parts"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    committed = PAGE.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(committed.splitlines(True), done.stdout.splitlines(True),
                                        "docs/parts.md", "headwise parts", n=1))
    assert committed == done.stdout, f"docs/parts.md is stale: regenerate it with `{REGENERATE}`\n{diff[:3000]}"


def test_the_page_names_every_kind_of_part_and_how_to_regenerate_it():
    text = PAGE.read_text(encoding="utf-8")
    assert f"```bash\n{REGENERATE}\n```" in text and "do not edit it by hand" in text
    for title in ("Task families", "Model front ends", "Output heads", "Attention kinds", "Model presets",
                  "Built-in studies", "Report layouts", "Bench sections"):
        assert f"\n## {title}\n" in text, title
    for row in ("| `local` | headwise.model.attention_local | `window` (int, default 256) | causal |",
                "| `nystrom` | headwise.model.attention_nystrom |", "| `global` (default) |",
                "| `tiny-lm` | lm | 4 x 4 | 128 | `tokens` -> `lm` |", "| `rank` | nearest | `nearest` | `rank` |",
                "| `tokenize` | headwise.families.lm.bench |"):
        assert row in text, row


def test_check_says_when_a_page_is_stale_and_out_writes_one_that_passes(tmp_path, capsys):
    page = tmp_path / "parts.md"
    page.write_text("# Registered parts\n\nan old table\n")
    assert main(["parts", "--check", str(page)]) == 1
    assert f"regenerate it with `headwise parts --out {page}`" in capsys.readouterr().err
    assert main(["parts", "--out", str(page)]) == 0
    assert main(["parts", "--check", str(page)]) == 0
    assert "is up to date" in capsys.readouterr().out
    assert main(["parts", "--check", str(tmp_path / "missing.md")]) == 1


def test_cells_are_the_first_sentence_of_a_docstring_in_markdown():
    assert summary("Softmax attention: :class:`~headwise.model.attention.AttentionKind` as it is.\n\nMore.") == \
        "Softmax attention: `AttentionKind` as it is."
    assert summary("Reads ``x`` from :mod:`headwise.spec` (see the module docstring). Then more.") == \
        "Reads `x` from `headwise.spec`."
    long = "A head: " + "word " * 30 + "(a: b; c) `d: e`."
    assert summary(long) == "A head"
    assert summary("`a: b` (c: d) " + "word " * 30 + "; the rest") == "`a: b` (c: d) " + " ".join(["word"] * 30)
    assert summary(None) == ""
    assert markdown_table(["a", "b"], [["x | y", "two\n lines"]]) == "| a | b |\n|---|---|\n| x \\| y | two lines |\n"
