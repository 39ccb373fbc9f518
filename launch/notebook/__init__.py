"""What the notebooks call, so each cell stays one call (docs/workbook.md).

runs.py           run recipes (one launch per world size), figures, invalid meshes, the CLI
tables.py         result tables: GroupInfo per unit, collectives per group, losses against the reference
exercises.py      predict-then-check exercises and their checks against the run
lessons.py        a recipe's own code (``inspect``), its trade-offs in numbers
memory_lesson.py  notebook 02's predictions from the cost model, beside a run's measured memory
magic.py          ``%%torchrun -n 4``: a cell on N ranks of the warm pool
widgets/          the mesh picker, the run widget, the planner and benchmark widgets
workbook.py       ``make workbook``: every notebook headless (papermill), in reading order
workbook_kernel.py  the kernel (and warm pool) a workbook worker keeps across its notebooks
"""
