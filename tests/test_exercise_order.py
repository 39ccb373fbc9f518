"""Predict, then check: no notebook shows an exercise's answer between its question and its check.

A question is asked (``ask("01.1")``), the learner writes an answer, and a check compares it with the
run. Every figure and table of a run shows counts and bytes (titles such as "5 AG, 3 RS"), so between
``ask(key)`` and ``check(key)`` a notebook may only run code whose output cannot answer: other
questions and checks, the answer cells, the mesh widget and its help, and the run itself (its progress
lines). The notebooks are read in cell order; a cell's output is what its code displays: the value of
its last expression (Jupyter shows it) and whatever the display functions it calls draw. The executed
notebooks (tests/test_notebooks.py) are held to the same rule on their real outputs.
"""

from __future__ import annotations

import ast

import nbformat
import pytest

from launch.notebook.exercises import EXERCISES
from launch.notebook.workbook import notebooks

NOTEBOOKS = {path.stem: path for path in notebooks()}
CHECKERS = {"check", "check_fits", "check_layout", "check_within"}
"""The calls that check an exercise (``launch.notebook.exercises``)."""

SILENT_CALLS = {
    "ask",  # another question
    "check",  # another exercise's check
    "check_fits",
    "check_layout",
    "check_within",
    "show_solution",  # only another exercise's (checked below)
    "widget_help",
    "MeshWidget",
    "run_recipes",  # prints progress lines (losses), no figure or count
    "run_bench",  # the same for the benchmark (its table is a separate call)
    "torchrun",
    "print",  # only inside the run's progress callback (checked below)
}
"""Calls that never show a count, a byte figure or a timeline."""


def _called_names(node: ast.AST) -> set[str]:
    names = set()
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        func = call.func
        names.add(func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else "?")
    return names


def _exercise_key(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def _calls_of(tree: ast.AST, names: set[str]) -> list[str]:
    return [
        _exercise_key(n)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names and _exercise_key(n)
    ]


def revealing_outputs(source: str, key: str) -> list[str]:
    """Why the cell's output could answer exercise ``key`` (empty: it cannot)."""
    if source.lstrip().startswith("%"):  # a cell magic (%%torchrun): the workers' code, shown by nothing
        return []
    tree = ast.parse(source)
    reasons = []
    if key in _calls_of(tree, {"show_solution"}):
        reasons.append("shows the solution")
    if _calls_of(tree, CHECKERS):  # another exercise's check prints that exercise's truth only
        return reasons
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1].value
        shown = isinstance(last, ast.Call) and _called_names(last) <= SILENT_CALLS
        if not shown and not (isinstance(last, ast.Name) and last.id == "picker"):
            reasons.append(f"displays {ast.unparse(last)[:60]!r}")
    for statement in tree.body:
        loud = _called_names(statement) - SILENT_CALLS
        if "print" in _called_names(statement) and not _prints_only_progress(statement):
            loud.add("print")
        if not isinstance(statement, (ast.Assign, ast.Expr, ast.Import, ast.ImportFrom, ast.Assert)):
            loud.add(type(statement).__name__)
        reasons += [f"calls {name}()" for name in sorted(loud) if name not in ("?",) and _displays(name)]
    return reasons


def _prints_only_progress(statement: ast.AST) -> bool:
    """A print inside a callback (``on_line=lambda ...: print(line)``) echoes the run's own lines; one
    whose arguments compute nothing (``print("torchrun:", process.error)``) reports the launch."""
    lambdas = [n for n in ast.walk(statement) if isinstance(n, ast.Lambda)]
    inside = {id(n) for lam in lambdas for n in ast.walk(lam)}
    prints = [
        n
        for n in ast.walk(statement)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"
    ]
    computes = [p for p in prints if any(isinstance(n, ast.Call) for arg in p.args for n in ast.walk(arg))]
    return all(id(p) in inside for p in computes)


DISPLAYS_NOTHING = {
    "dict",
    "set",
    "list",
    "sorted",
    "sum",
    "len",
    "str",
    "Path",
    "mkdir",
    "mkdtemp",
    "write_text",
    "load_json",
    "dumps",
    "ParallelDims",
    "items",
    "get",
    "isinstance",
    "zip",
    "max",
    "min",
    "float",
    "int",
    "range",
    "collective_counts",
    "load_traces",
}
"""Calls that compute without displaying (a cell made only of them shows nothing)."""


def _displays(name: str) -> bool:
    return name not in DISPLAYS_NOTHING


def exercise_cells(nb) -> dict[str, tuple[int, int]]:
    """key -> (index of the ask cell, index of the check cell)."""
    asks, checks = {}, {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or cell.source.lstrip().startswith("%"):
            continue
        tree = ast.parse(cell.source)
        for key in _calls_of(tree, {"ask"}):
            asks.setdefault(key, index)
        for key in _calls_of(tree, CHECKERS):
            checks.setdefault(key, index)
    assert set(asks) == set(checks), (sorted(asks), sorted(checks))
    return {key: (asks[key], checks[key]) for key in asks}


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_every_check_comes_before_any_output_that_answers_it(name):
    nb = nbformat.read(NOTEBOOKS[name], as_version=4)
    for key, (asked, checked) in exercise_cells(nb).items():
        assert key in EXERCISES and asked < checked, (name, key)
        for index in range(asked + 1, checked):
            cell = nb.cells[index]
            if cell.cell_type == "code":
                reasons = revealing_outputs(cell.source, key)
                assert not reasons, f"{name} cell {index}, between ask({key!r}) and its check: {reasons}"


def test_every_exercise_is_asked_and_checked_in_one_notebook():
    seen: dict[str, str] = {}
    for name, path in NOTEBOOKS.items():
        for key in exercise_cells(nbformat.read(path, as_version=4)):
            assert key not in seen, (key, seen.get(key), name)
            assert key.split(".")[0] == name.split("_")[0], (key, name)  # "05.2" is asked in 05_hsdp
            seen[key] = name
    assert set(seen) == set(EXERCISES)


def test_the_rule_catches_what_answers():
    """A figure, a table, a trailing value and the exercise's own solution reveal; the run, the widget and
    the answer cell do not."""
    assert revealing_outputs('m4_figs["timeline"]', "01.1")
    assert revealing_outputs('ideal_timeline(ideal_schedule(2), "M4")', "01.1")
    assert revealing_outputs("tradeoff_table(results['M4'])", "01.1")
    assert revealing_outputs('show_solution("01.1")', "01.1")
    assert revealing_outputs('x = 1\nprint(collective_count(results["M4"]))', "01.1")
    assert not revealing_outputs('show_solution("01.2")', "01.1")
    assert not revealing_outputs("answer_1 = None  # your prediction", "01.1")
    assert not revealing_outputs("results = run_recipes({'M4': m4}, steps=steps)", "01.1")
    assert not revealing_outputs("picker = MeshWidget('M4', **m4)\npicker", "01.1")
    assert not revealing_outputs("launch.torchrun('s.py', 4, on_line=lambda r, line: print(line))", "10.1")
