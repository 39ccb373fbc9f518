"""Widgets and small displays for the notebooks: pick mesh degrees, see the mesh, launch a run, export a report.

    picker = MeshWidget("M4", world_size=2, dp_shard=2)   # display it as the last line of a cell
    picker.degrees      # {"world_size": 2, "dp_replicate": 1, "dp_shard": 2, ...}: rebind a notebook's parameters
    picker.valid, picker.error, picker.dims
    picker.launch()     # what the Launch button does: launch.run in a background thread
    picker.wait(); picker.result, picker.figures
    picker.export_report()   # what Export report does: RUN_DIR/report.html (launch.report)

    picker.py       DegreePicker: selectors offering only valid meshes, the rule of an invalid one, preview
    mesh_widget.py  MeshWidget: the picker plus Launch / Stop / progress / logs / figures / Export report
    plan_widget.py  PlanWidget: a layout at scale with the cost model's memory / communication bars
    bench_widget.py BenchWidget: world size, configurations and pairs of ``python -m launch bench``
    alpha_beta_widget.py AlphaBetaWidget: a collective's time from the alpha-beta model on a chosen link
    display.py      recipe_card, cli_command, widget_help: what the notebooks show (``table``: launch.tables)

Nothing here starts a worker until Launch is clicked (or ``launch()`` called).
"""

from launch.notebook.widgets.alpha_beta_widget import AlphaBetaWidget
from launch.notebook.widgets.bench_widget import BenchWidget
from launch.notebook.widgets.display import WIDGET_HELP, cli_command, recipe_card, widget_help
from launch.notebook.widgets.mesh_widget import MeshWidget, Stopped
from launch.notebook.widgets.picker import DEGREES, HELP, DegreePicker, valid_meshes
from launch.notebook.widgets.plan_widget import PlanWidget
from launch.tables import table

__all__ = [
    "DEGREES",
    "HELP",
    "WIDGET_HELP",
    "AlphaBetaWidget",
    "BenchWidget",
    "DegreePicker",
    "MeshWidget",
    "PlanWidget",
    "Stopped",
    "cli_command",
    "recipe_card",
    "table",
    "valid_meshes",
    "widget_help",
]
