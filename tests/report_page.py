"""Shared by the report tests (tests/test_report_*.py): ``Page``, a stdlib ``html.parser`` reading of a report
into tags, texts and the number cells it marks with ``data-key``/``data-value``; synthetic run directories as
the launcher leaves them after a failure (with hostile text in the logs); and the check that a page loads
nothing from outside itself.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from hyper_parallel.run_files import SUMMARY_FILE

INJECTED = '<script>alert("pwned")</script> & <img src=http://example.com/x.png>'
ERROR = (
    'rank 1 failed: exit code 1\nTraceback (most recent call last):\n  File "worker.py", line 3\nRuntimeError: boom <b>'
)


class Page(HTMLParser):
    """The parts of a report the tests look at: tags with attributes and ancestors, texts, number cells."""

    VOID = frozenset({"meta", "img", "br", "hr", "link", "input"})

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, dict]] = []
        self.tags: list[tuple[str, dict, tuple[str, ...]]] = []
        self.texts: list[tuple[str, tuple[str, ...], tuple[dict, ...]]] = []
        self.cells: dict[tuple[str, int | None], tuple[str, str]] = {}  # (data-key, step) -> (data-value, text)
        self.cell_list: list[tuple[str, str | None, str]] = []  # (data-key, data-value, text), repeats kept
        self.degree_cells: dict[str, str] = {}
        self._cell: tuple[dict, list[str]] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs, tuple(t for t, _ in self.stack)))
        if tag == "td" and ("data-key" in attrs or "data-degree" in attrs):
            self._cell = (attrs, [])
        if tag not in self.VOID:
            self.stack.append((tag, attrs))

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            attrs, text = self._cell
            if "data-degree" in attrs:
                self.degree_cells[attrs["data-degree"]] = "".join(text)
            else:
                step = int(attrs["data-step"]) if "data-step" in attrs else None
                self.cells[(attrs["data-key"], step)] = (attrs.get("data-value"), "".join(text))
                self.cell_list.append((attrs["data-key"], attrs.get("data-value"), "".join(text)))
            self._cell = None
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1].append(data)
        self.texts.append((data, tuple(t for t, _ in self.stack), tuple(a for _, a in self.stack)))

    def find(self, tag: str, **attrs: str) -> list[dict]:
        return [
            a for t, a, _ in self.tags if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    def figures(self) -> dict[str, str]:
        """data-figure -> the src of the <img> inside that <figure>."""
        found, current = {}, None
        for tag, attrs, _ in self.tags:
            if tag == "figure":
                current = attrs.get("data-figure")
            elif tag == "img" and current is not None:
                found[current] = attrs.get("src", "")
                current = None
        return found

    def text_in(self, section: str) -> str:
        return "".join(text for text, _, attrs in self.texts if any(a.get("id") == section for a in attrs))


def write_log(log_root: Path, rank: int, stream: str, lines: list[str]) -> None:
    folder = log_root / "4f1c-launch" / "attempt_0" / str(rank)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stream}.log").write_text("".join(line + "\n" for line in lines))


def failed_run(folder: Path, with_logs: bool = True) -> Path:
    """What the launcher leaves after rank 1 raised: summary.json with the error, logs, no metrics, no traces."""
    folder.mkdir(parents=True)
    summary = {
        "recipe": "M4",
        "degrees": {"world_size": 2, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 1, "pp": 1, "ep": 1, "etp": 1},
        "ok": False,
        "losses": [],
        "reference_losses": [],
        "max_abs_diff": None,
        "max_param_diff": None,
        "step_times": [],
        "returncode": 1,
        "duration": 12.5,
        "error": ERROR,
    }
    (folder / SUMMARY_FILE).write_text(json.dumps(summary))
    if not with_logs:
        return folder
    logs = folder / "torchrun_logs_abc"
    write_log(logs, 0, "stdout", [f"rank 0 line {i}" for i in range(2050)])
    write_log(logs, 0, "stderr", [])
    write_log(logs, 1, "stdout", ["starting", INJECTED])
    write_log(logs, 1, "stderr", ERROR.splitlines()[1:])
    return folder


def assert_self_contained(page: Page) -> None:
    for tag, attrs, _ in page.tags:
        assert tag != "link", attrs
        for name in ("src", "href", "srcset", "action", "poster", "data"):
            value = attrs.get(name)
            if value is not None:
                assert value.startswith(("data:", "#")), (tag, name, value[:80])
    assert [a for a in page.find("script")] == [{}]  # our one inline script (it unfolds logs to print)
