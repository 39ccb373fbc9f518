"""The workbook's notebooks: committed clean, and each runs headless under papermill.

Every notebook is executed once with its default parameters, two at a time as ``make workbook`` runs them
(``run_workbook``: 91_performance alone, last, on 2 ranks here), plus ``01_ddp_fsdp`` with non-default
degrees. A run fails on
any cell error; the executed notebook must hold its figures (image/png outputs), have saved them
under ``figures_dir``, and print its closing check (numerics matched the reference, or the
notebook's own checks where no worker runs).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from conftest import SAVES_FIGURES

from launch.notebook.workbook import READING_ORDER, execute_notebook, notebooks

NOTEBOOKS = {path.stem: path for path in notebooks()}
EXPECTED = [  # in reading order: name: (text the closing cell prints, minimum image/png outputs)
    ("00_start_here", "numerics check passed", 3),
    ("00b_collectives", "collectives checks passed", 2),
    ("01_ddp_fsdp", "numerics check passed", 13),
    ("02_memory", "memory checks passed", 1),
    ("03_tensor_sequence_parallel", "numerics check passed", 14),
    ("04_context_parallel", "numerics check passed", 15),
    ("05_hsdp", "numerics check passed", 8),
    ("06_mesh_algebra", "mesh algebra checks passed", 2),
    ("07_fully_shard_groupinfo", "numerics check passed", 6),
    ("08_moe_expert_parallel", "numerics check passed", 11),
    ("09_pipeline_parallel", "numerics check passed", 5),
    ("10_pure_tp_fix", "numerics check passed", 2),
    ("11_planning_at_scale", "planning checks passed", 2),
    ("12_your_own_model", "numerics check passed", 3),
    ("90_negative_cases", "negative cases passed", 0),
    ("91_performance", "numerics check passed", 3),
    ("92_recipe_matrix", "recipe matrix checks passed", 0),
]


def outputs(nb, kind: str | None = None) -> list:
    found = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    return [o for o in found if kind is None or kind in o.get("data", {})]


def stdout(nb) -> str:
    return "".join(o.get("text", "") for o in outputs(nb) if o.get("output_type") == "stream")


# ------------------------------------------------------------------ committed notebooks


def test_the_workbook_has_every_notebook():
    assert sorted(NOTEBOOKS) == sorted(name for name, _, _ in EXPECTED)


def test_notebooks_come_in_reading_order_and_link_the_next_one():
    """`make workbook` and these tests run the path in reading order; every notebook opens with what it
    builds on ("You need:") and its last words name the next notebook of the path (the last one, 00)."""
    assert list(NOTEBOOKS) == list(READING_ORDER) == [name for name, _, _ in EXPECTED]
    assert list(READING_ORDER) == sorted(READING_ORDER)  # the file names follow the path
    start = nbformat.read(NOTEBOOKS["00_start_here"], as_version=4).cells[0].source
    for name in READING_ORDER[1:]:  # 00's map lists the path in the same order
        assert f"`{name}`" in start, name
    positions = [start.index(f"`{name}`") for name in READING_ORDER[1:]]
    assert positions == sorted(positions)
    for index, name in enumerate(READING_ORDER):
        nb = nbformat.read(NOTEBOOKS[name], as_version=4)
        opening = " ".join(cell.source for cell in nb.cells[:2])  # the title cell, or the one right after it
        assert "**You need:**" in opening, f"{name}: no 'You need:'"
        following = READING_ORDER[(index + 1) % len(READING_ORDER)]
        markdown = [cell.source for cell in nb.cells if cell.cell_type == "markdown"]
        assert markdown[-1].startswith("**Next:**") and f"({following}.ipynb)" in markdown[-1], (name, markdown[-1])


def test_titles_and_the_map_number_each_notebook_as_its_file_does():
    """A title ("# 05 · HSDP ...") and a row of 00's map carry the file's number ("00b" for 00b_collectives),
    and "You need:" names only notebooks before it: all three outlived a renumbering once (titles said 13
    for 05_hsdp)."""
    start = nbformat.read(NOTEBOOKS["00_start_here"], as_version=4).cells[0].source
    for name in READING_ORDER[1:]:
        number = name.split("_")[0]  # "05", or "00b" for a notebook slotted in after 00
        nb = nbformat.read(NOTEBOOKS[name], as_version=4)
        assert nb.cells[0].source.startswith(f"# {number} · "), (name, nb.cells[0].source.splitlines()[0])
        assert f"| {number} | `{name}` |" in start, f"00's map numbers {name} otherwise"
        opening = " ".join(cell.source for cell in nb.cells[:2])
        needs = opening[opening.index("**You need:**") :].split("\n\n")[0]
        mentioned = {int(n) for n in re.findall(r"(?<![\w.])(\d\d)(?=_[a-z]|\b(?! ?(?:%|s\b|ms\b)))", needs)}
        position = (int(number[:2]), number[2:])
        assert all((n, "") < position for n in mentioned), f"{name} needs a later notebook: {needs!r}"


def test_no_notebook_cites_documents_a_learner_does_not_have():
    for name, path in NOTEBOOKS.items():
        text = path.read_text()
        for citation in ("seed 002", "DESIGN.md", "RFC 2.", "RFC 4.", "RFC requirement", "../shared"):
            assert citation not in text, f"{name} cites {citation!r}"


def test_every_notebook_opens_with_what_it_needs_then_its_parameters():
    """The same order everywhere: the title and "You need:" in markdown, then the parameters cell as the
    first code (papermill injects there; nothing runs before the learner's choices)."""
    for name, path in NOTEBOOKS.items():
        cells = nbformat.read(path, as_version=4).cells
        first_code = next(i for i, cell in enumerate(cells) if cell.cell_type == "code")
        assert "parameters" in cells[first_code].metadata.get("tags", []), f"{name}: code runs before the parameters"
        assert any("**You need:**" in cell.source for cell in cells[:first_code]), f"{name}: 'You need:' comes late"


def test_every_table_a_cell_builds_is_shown():
    """``table(...)`` returns an HTML object that Jupyter shows only as a cell's last expression: one built
    earlier in a cell (a ``print`` after it) is silently dropped, as 11's per-stage pipeline table once was."""
    import ast

    for name, path in NOTEBOOKS.items():
        for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type != "code" or cell.source.lstrip().startswith("%%"):
                continue
            python = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
            body = ast.parse(python).body
            for statement in body[:-1]:
                call = statement.value if isinstance(statement, ast.Expr) else None
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "table":
                    raise AssertionError(f"{name} cell {index}: table(...) is not the cell's last expression")


def test_progress_lines_number_steps_as_the_figures_do():
    """A 2-step run's progress lines say steps 0 and 1, like the timelines' "step 1" and the tables."""
    from launch.notebook.widgets.display import step_text

    lines = [step_text({"step": done, "steps": 2, "loss": 1.0, "reference": 1.0}) for done in (1, 2)]
    assert lines[0].startswith("step 0 (1/2 done)") and lines[1].startswith("step 1 (2/2 done)")


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_committed_notebook_is_clean_and_has_a_parameters_cell(name):
    nb = nbformat.read(NOTEBOOKS[name], as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    assert "widgets" not in nb.metadata, "widget state must not be committed"
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"cell {index} has outputs"
            assert cell.execution_count is None, f"cell {index} has an execution count"
    tagged = [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0].cell_type == "code"
    for parameter in ("figures_dir", "runs_dir"):  # set by `make workbook`
        assert f"{parameter} = None" in tagged[0].source
    for line in tagged[0].source.splitlines():  # papermill's parser: one assignment per line
        assert line.count("=") <= 1, line
    assert nb.cells[-1].cell_type == "code" and "assert" in nb.cells[-1].source  # headless failures are visible


# ------------------------------------------------------------------ executed notebooks


def run(name: str, tmp_path: Path, save_figures: bool = True, **parameters) -> nbformat.NotebookNode:
    figures_dir, runs_dir = tmp_path / "figures", tmp_path / "runs"
    params = {"figures_dir": str(figures_dir) if save_figures else None, "runs_dir": str(runs_dir), **parameters}
    ok, error = execute_notebook(NOTEBOOKS[name], tmp_path / f"{name}.ipynb", params)
    assert ok, f"{name}: {error}"
    return nbformat.read(tmp_path / f"{name}.ipynb", as_version=4)


def answers_shown_before_their_check(nb) -> list[str]:
    """Figures or tables (image/png, text/html outputs other than the question itself) that the executed
    notebook shows between an exercise's question and its check (tests/test_exercise_order.py holds the
    sources to the same rule)."""
    import ast

    from test_exercise_order import CHECKERS, _calls_of, exercise_cells

    found = []
    for key, (asked, checked) in exercise_cells(nb).items():
        for index in range(asked + 1, checked):
            source = nb.cells[index].source
            if source.lstrip().startswith("%"):  # a cell magic (%%torchrun): Python below its first line
                source = source.lstrip().partition("\n")[2]
            tree = ast.parse(source) if nb.cells[index].cell_type == "code" else None
            if tree is None or set(_calls_of(tree, CHECKERS | {"show_solution"})) - {key}:
                continue  # markdown, or another exercise's check or solution
            for output in nb.cells[index].get("outputs", []):
                data = output.get("data", {})
                if "image/png" in data or (
                    "text/html" in data and "application/vnd.jupyter.widget-view+json" not in data
                ):
                    found.append(f"cell {index} shows {sorted(data)} before the check of {key}")
    return found


@pytest.mark.distributed
@pytest.mark.parametrize("name,closing,min_images", EXPECTED)
def test_notebook_runs_headless_with_its_figures_and_numerics(name, closing, min_images, workbook):
    executed = workbook / f"{name}.ipynb"
    assert executed.exists(), f"{name} was not executed (see the workbook's lines above)"
    nb = nbformat.read(executed, as_version=4)
    errors = [o for o in outputs(nb) if o.get("output_type") == "error"]
    assert not errors
    images = outputs(nb, "image/png")
    assert len(images) >= min_images, f"{name}: {len(images)} image/png outputs"
    if name in SAVES_FIGURES:
        saved = list((workbook / "figures" / name).rglob("*.png"))
        # saved as PNG, and a run's figures only when shown (drawn lazily): fewer files than images shown
        assert 1 <= len(saved) <= len(images) and not list((workbook / "figures" / name).rglob("*.svg")), name
    assert closing in stdout(nb)
    assert not answers_shown_before_their_check(nb), name
    assert outputs(nb, "application/vnd.jupyter.widget-view+json"), f"{name} shows no mesh widget"
    if closing == "numerics check passed" and name != "10_pure_tp_fix":
        for metrics_file in (workbook / "runs" / name).glob("*/metrics.json"):
            metrics = json.loads(metrics_file.read_text())
            assert metrics["ok"] and metrics["max_abs_diff"] < 1e-5, metrics_file


@pytest.mark.distributed
def test_notebook_runs_with_non_default_degrees(tmp_path):
    """01_ddp_fsdp on 4 ranks: DDP over dp_replicate x dp_shard, FSDP over 4 shards."""
    m1 = {"world_size": 4, "dp_replicate": 2, "dp_shard": 2}
    m4 = {"world_size": 4, "dp_shard": 4}
    nb = run("01_ddp_fsdp", tmp_path, save_figures=False, m1=m1, m4=m4)
    text = stdout(nb)
    assert "launching 4 ranks for M1, M4" in text
    assert "OK     M1 (world_size=4: dp_replicate=2, dp_shard=2)" in text
    assert "OK     M4 (world_size=4: dp_shard=4)" in text
    assert "numerics check passed" in text
    for label, degrees in (("M1", m1), ("M4", m4)):
        metrics = json.loads((tmp_path / "runs" / label / "metrics.json").read_text())
        assert {k: metrics["degrees"][k] for k in degrees} == degrees and metrics["ok"]
    assert len(outputs(nb, "image/png")) >= 13
