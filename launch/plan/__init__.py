"""``python -m launch plan``: a layout of thousands of ranks checked and costed in one process.

flags.py           the command line: flags, and what runs for which of them
build.py           one plan: the DeviceMesh groups of a layout, its cost, its torchrun command
render.py          a plan (or a ranking of layouts) as text or JSON
review_page.py     named layouts side by side (``--layouts``): text, Markdown, CSV, JSON, HTML
review_example.py  docs/design_review_512.*, the worked review (make docs regenerates it, a test compares)
multinode.py       the torchrun line of a multi-node job (printed, never run here), for plan and `launch command`
"""
