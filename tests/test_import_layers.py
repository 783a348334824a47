"""Which way imports may point: every module of ``src/headwise``, parsed (not imported), sits in one
layer, and its module-level imports point to its own layer or below. Two rules hold for imports
anywhere, inside functions too: nothing below the families imports a family (importing the
``headwise.families`` package to discover them is allowed), and the study never imports the report.
No module-level import cycle. ``docs/architecture.md`` draws the same layers.

Imports inside functions may point up: that is how a module defers what is heavy or optional
(torch in the attention kinds, the families in a registry's discovery, the report's figures).
Imports under ``if TYPE_CHECKING:`` are annotations, not imports.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

#: The layers, lowest first: (name, module patterns). A module belongs to the layer of the
#: longest pattern it matches (``headwise.model.attention*`` before ``headwise.model.*``); every
#: module must match one.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # no torch, no headwise beyond each other; the families package only lists the families
    ("base", ("headwise.errors", "headwise.registry", "headwise.paths", "headwise.config", "headwise.locks",
              "headwise.lazy", "headwise.families")),
    # what a spec is, what checking and counting one needs (another library's model source too): the parts' declarations (their counts
    # too), the attention kinds, output gates and block features (their model code imported inside
    # their functions), plans, presets, exact counts; no torch at import. The model package's
    # __init__ loads its names on first use, so importing a kind loads no model.
    ("spec", ("headwise.layer_shape", "headwise.parts", "headwise.spec", "headwise.plans", "headwise.presets",
              "headwise.model_sources", "headwise.budget",
              "headwise.params", "headwise.model.attention*", "headwise.model.features",
              "headwise.model")),
    ("model", ("headwise.model.*",)),
    # a run's folder, data and text below the tasks that read them
    ("data", ("headwise.run", "headwise.run.*", "headwise.data", "headwise.data.*", "headwise.text",
              "headwise.text.*")),
    ("tasks", ("headwise.tasks", "headwise.tasks.*")),
    # training measures its models with the analysis (conditioning), and the analysis of runs reads them back
    ("train", ("headwise.train", "headwise.train.*", "headwise.analysis", "headwise.analysis.*")),
    # transformers classes, export and conversion: a run's model as Hugging Face loads it
    ("hf", ("headwise.hf", "headwise.hf.*")),
    # each family: its task, data, model parts, presets (its report layouts and bench section plug
    # into the report and the bench, and sit with them)
    ("families", ("headwise.families.*",)),
    ("bench", ("headwise.bench", "headwise.bench.*", "headwise.families.*.bench", "headwise.families.*.bench_*")),
    # a search folder's record (trials.json, search.toml) is read as data by reports beside the study's
    ("study", ("headwise.study", "headwise.study.*", "headwise.search.record")),
    ("report", ("headwise.report", "headwise.report.*", "headwise.families.*.report", "headwise.families.*.report_*")),
    # the search runs its trials as study jobs and its confirmation as a study, whose report it writes
    ("search", ("headwise.search", "headwise.search.*")),
    ("commands", ("headwise.commands", "headwise.commands.*", "headwise.cli", "headwise.__main__", "headwise")),
]
FAMILIES = "headwise.families"


def _layer(module: str) -> int:
    """The index of the layer ``module`` belongs to (see :data:`LAYERS`)."""
    matches = [(len(p), i) for i, (_, patterns) in enumerate(LAYERS) for p in patterns if fnmatchcase(module, p)]
    if not matches:
        raise AssertionError(f"{module} is in no layer of LAYERS: add it to the one it belongs to")
    return max(matches)[1]


def _index(name: str) -> int:
    return [n for n, _ in LAYERS].index(name)


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "headwise").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported headwise module, line, at module level) for every import of ``name``, relative
    ones resolved; ``from X import y`` imports ``X.y`` where that is a module, else ``X``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def visit(nodes: list[ast.stmt], top: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend((a.name, node.lineno, top) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                for alias in node.names:
                    child = f"{base}.{alias.name}"
                    found.append((child if child in MODULES else base, node.lineno, top))
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse, top)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(node.body, False)
            else:  # class bodies, with, try, loops: run at import when they sit at the top
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit(getattr(node, field, []), top)

    visit(ast.parse(path.read_text(encoding="utf-8")).body, True)
    return sorted({(m, line, top) for m, line, top in found if m == "headwise" or m.startswith("headwise.")})


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def test_every_module_has_a_layer():
    for name in MODULES:
        _layer(name)


def test_module_level_imports_point_down():
    wrong = [f"{name}:{line} ({LAYERS[_layer(name)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
             for name, found in IMPORTS.items() for target, line, top in found
             if top and target in MODULES and _layer(target) > _layer(name)]
    assert not wrong, "\n".join(wrong)


def test_nothing_below_the_families_imports_a_family():
    below = _index("families")
    wrong = [f"{name}:{line} imports {target}" for name, found in IMPORTS.items() for target, line, _ in found
             if _layer(name) < below and target.startswith(f"{FAMILIES}.")]
    assert not wrong, "\n".join(wrong)


def test_the_study_does_not_import_the_report():
    wrong = [f"{name}:{line} imports {target}" for name, found in IMPORTS.items() for target, line, _ in found
             if (name == "headwise.study" or name.startswith("headwise.study."))
             and (target == "headwise.report" or target.startswith("headwise.report."))]
    assert not wrong, "\n".join(wrong)


def test_no_module_level_import_cycle():
    graph = {name: sorted({t for t, _, top in found if top and t in MODULES and t != name})
             for name, found in IMPORTS.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = path[path.index(name):] + [name]
            pytest.fail("module-level import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for target in graph[name]:
            visit(target, [*path, name])
        done.add(name)

    for name in graph:
        visit(name, [])


def _loaded_after(code: str) -> list[str]:
    """The torch, family, report and matplotlib modules a fresh interpreter holds after ``code``."""
    probe = (f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('torch', 'matplotlib') or m.startswith(('headwise.families.', 'headwise.report')))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_spec_is_checked_without_torch_or_a_family():
    assert _loaded_after("import headwise.spec") == []
    assert _loaded_after("from headwise.spec import ModelSpec\n"
                         "ModelSpec(d_model=8, n_layers=1, heads=[2], vocab_size=10)\n"
                         "ModelSpec(inputs='images', image_size=8, patch_size=4, channels=1, num_classes=3, d_model=8, "
                         "n_layers=1, heads=[2], causal=False)") == []


def test_counts_budgets_and_the_search_space_load_no_torch():
    assert _loaded_after("import headwise.params, headwise.budget, headwise.search.space, "
                         "headwise.search.scaled") == []
    # the counts are the declarations': a spec of built-in parts is counted without its model code
    assert _loaded_after("from headwise.params import count_params, plan_budget\n"
                         "from headwise.spec import ModelSpec\n"
                         "spec = ModelSpec(d_model=8, n_layers=2, heads=[2, 4], vocab_size=10)\n"
                         "plan_budget(spec, 16)\n"
                         "count_params(ModelSpec(inputs='images', image_size=8, patch_size=4, channels=1, "
                         "num_classes=3, d_model=8, n_layers=1, heads=[2], causal=False))") == []


def test_the_plan_command_loads_no_torch():
    """`headwise plan` through the CLI: building the parser of every command (the bench sections'
    list waits for --help) and counting the plan load no torch."""
    loaded = _loaded_after("from headwise.cli import main\n"
                           "main(['plan', '--d-model', '96', '--layers', '4', '--total-heads', '24', "
                           "'--scheme', 'constant'])")
    assert loaded == [], loaded


def test_the_definitions_and_the_task_tables_load_no_torch():
    """A study's and a search's definition read their runs' configs (every family's ``[task]`` table
    among them) from declarations: no task, trainer or model code, so no torch."""
    loaded = _loaded_after("import headwise.search.space, headwise.search.definition, headwise.study.definition, "
                           "headwise.tasks.union")
    assert not [m for m in loaded if m.split(".")[0] == "torch"], loaded


@pytest.mark.parametrize("what, name", [("study", "progression"), ("search", "progression"),
                                        # a family's own model parts (mlm, cls_pooler; token_pairs):
                                        # their declarations, not their model code
                                        ("study", "encoder"), ("study", "lra")])
def test_a_dry_run_loads_no_torch(what, name):
    """A study's dry run loads nothing of the report either; a search's definition reads some of
    it (its confirmation is a study with a report), but no figures."""
    preset = "quick" if name == "progression" else "paper"
    loaded = _loaded_after(f"from headwise.cli import main\nassert main([{what!r}, {name!r}, '--preset', "
                           f"{preset!r}, '--dry-run']) == 0")
    assert not [m for m in loaded if m.split(".")[0] in ("torch", "matplotlib")], loaded
    if what == "study":
        assert not [m for m in loaded if m.startswith("headwise.report")], loaded
