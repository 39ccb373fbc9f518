"""The alpha-beta model in a notebook: pick a collective, a link, the ranks and a size; read its time.

    widget = AlphaBetaWidget({"this machine": Link(...), **LINKS})   # display it
    widget.set(op="all_gather", link="nvlink", ranks=8, size=1 << 20)   # what the selectors do
    widget.seconds, widget.text

Nothing runs: the time is ``hyper_parallel.cost_model.alpha_beta.predict_seconds`` (ring; the tree too
for an all-reduce), split into its latency part (alpha x steps) and its bandwidth part (bytes / beta).
"""

from __future__ import annotations

import html
from collections.abc import Mapping

import ipywidgets as widgets

from hyper_parallel.cost_model.alpha_beta import COLLECTIVES, Link, hops, wire
from hyper_parallel.viz.style import fmt_bytes

RANKS = (2, 4, 8, 16, 64, 256, 1024, 4096)
SIZES = tuple(1 << k for k in range(0, 31, 2))


class AlphaBetaWidget(widgets.VBox):
    """Selectors for collective, link, ranks and size, and the model's time with its two terms."""

    def __init__(self, links: Mapping[str, Link], op: str = "all_reduce", ranks: int = 8, size: int = 1 << 20):
        if not links:
            raise ValueError("AlphaBetaWidget needs at least one link, e.g. hyper_parallel.cost_model.alpha_beta.LINKS")
        self.links = dict(links)
        self.op = widgets.Dropdown(options=list(COLLECTIVES), value=op, description="collective")
        self.link = widgets.Dropdown(
            options=[(link.name, key) for key, link in self.links.items()], value=next(iter(self.links))
        )
        self.link.description = "link"
        self.ranks = widgets.SelectionSlider(options=list(RANKS), value=ranks, description="ranks")
        self.size = widgets.SelectionSlider(options=[(fmt_bytes(s), s) for s in SIZES], value=size, description="bytes")
        self.output = widgets.HTML()
        for control in (self.op, self.link, self.ranks, self.size):
            control.observe(lambda _change: self._update(), names="value")
        super().__init__([widgets.HBox([self.op, self.link]), widgets.HBox([self.ranks, self.size]), self.output])
        self._update()

    def set(self, **values) -> None:
        """Change selectors by name (op, link, ranks, size), as a click would."""
        for name, value in values.items():
            if name not in ("op", "link", "ranks", "size"):
                raise ValueError(f"AlphaBetaWidget has no selector {name!r}: op, link, ranks, size")
            getattr(self, name).value = value

    def _update(self) -> None:
        link, op, n, size = self.links[self.link.value], self.op.value, self.ranks.value, self.size.value
        latency, bandwidth = link.alpha * hops(op, n), wire(op, n) * size / link.beta
        self.seconds = latency + bandwidth
        self.text = (
            f"{op} of {fmt_bytes(size)} on {n} ranks over {link.name}: {self.seconds * 1e3:.4g} ms = "
            f"{hops(op, n)} steps x {link.alpha * 1e6:.3g} us + {wire(op, n):.3g} x {fmt_bytes(size)} / "
            f"{link.beta / 1e9:.3g} GB/s ({latency / self.seconds:.0%} latency)"
        )
        if op == "all_reduce":
            tree = link.seconds(op, n, size, "tree")
            self.text += f"; a tree: {tree * 1e3:.4g} ms ({'faster' if tree < self.seconds else 'slower'})"
        self.output.value = f"<p>{html.escape(self.text)}</p>"
