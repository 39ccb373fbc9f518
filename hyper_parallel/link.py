"""An emulated link: every traced collective completes no earlier than α + n·β after it is issued.

On 2 shared CPU cores gloo's loopback is so fast and so noisy that no timeline shows communication hiding
behind compute. With a link of chosen latency α (``latency_s``) and bandwidth 1/β (``bytes_per_s``) the
training thread is held until each collective's emulated end, so the learner sees what a slow link costs
and what overlap buys. It is an *emulation*: the real transfer still runs on gloo (the same bytes, the
same sums, so the numbers are bit for bit those of a run without it); the emulation only delays the moment
the collective counts as complete, sleeping (no CPU burnt) until then.

The time model, per rank (``Link.seconds``):

    seconds = α + n·β,    n = bytes this rank puts on the wire = buffer bytes x wire_factor(op, group size)

(ring bound: all-gather, reduce-scatter, all-to-all (n-1)/n, all-reduce 2(n-1)/n of the full buffer, the
trace's ``bytes``; a ring exchange's larger message). Each group is one link: a collective issued while an
earlier one on the same group is still on the wire starts when that one ends (first in, first out), as on
one NIC; collectives on different groups do not slow each other. Pipeline P2P that torch's schedules post
themselves are not delayed (their trace events have no duration).

    link = parse_link("2ms,1MB/s")            # or LINK_PRESETS["notebook"], or Link(2e-3, 1e6)
    with emulating(link):                     # the worker's run (``RunSpec.link``)
        end = reserve("all_gather", "fsdp", 2, nbytes)   # hyper_parallel.comm, when it issues
        ...; hold_until(end)                             # when it is waited for

Torch-free: the launcher parses and checks a link before any worker starts; the cost model times the same
α + n·β (``cost_model.emulated``).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


def wire_factor(op: str, n: int) -> float:
    """Bytes one rank sends per byte of the full buffer with ring algorithms on a group of n ranks:
    all-gather, reduce-scatter, all-to-all (even splits), broadcast (average): (n-1)/n; all-reduce
    (reduce-scatter + all-gather): 2(n-1)/n."""
    if op in ("send", "recv"):  # pipeline P2P: ``bytes`` is what this rank sends / receives
        return 1.0 if op == "send" else 0.0
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


@dataclass(frozen=True)
class Link:
    """A link of ``latency_s`` seconds (α) per collective and ``bytes_per_s`` (1/β) per rank."""

    latency_s: float
    bytes_per_s: float

    def __post_init__(self) -> None:
        if not (isinstance(self.latency_s, (int, float)) and math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError(f"a link's latency_s must be a finite number of seconds >= 0, got {self.latency_s!r}")
        if not (
            isinstance(self.bytes_per_s, (int, float)) and math.isfinite(self.bytes_per_s) and self.bytes_per_s > 0
        ):
            raise ValueError(f"a link's bytes_per_s must be a finite number > 0, got {self.bytes_per_s!r}")

    @property
    def beta(self) -> float:
        """Seconds per byte on the wire."""
        return 1.0 / self.bytes_per_s

    def seconds(self, op: str, group_size: int, nbytes: float) -> float:
        """α + n·β of one collective (module docstring); 0 for a group of one rank (nothing is sent)."""
        if group_size <= 1 and op not in ("send", "recv"):
            return 0.0
        return self.latency_s + nbytes * wire_factor(op, group_size) * self.beta

    def text(self) -> str:
        """The form ``parse_link`` reads back to the same link (the worker's ``--link`` flag)."""
        return f"{self.latency_s!r}s,{self.bytes_per_s!r}B/s"

    def describe(self) -> str:
        """For a figure's title or a table: 'emulated link: α 2 ms, 1 MB/s'."""
        return f"emulated link: α {self.latency_s * 1e3:g} ms, {_rate(self.bytes_per_s)}"

    def to_json(self) -> dict[str, float]:
        return {"latency_s": self.latency_s, "bytes_per_s": self.bytes_per_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Link | None:
        return None if data is None else cls(float(data["latency_s"]), float(data["bytes_per_s"]))


def _rate(bytes_per_s: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= size:
            return f"{bytes_per_s / size:g} {unit}"
    return f"{bytes_per_s:g} B/s"


LINK_PRESETS: dict[str, Link] = {
    # the workbook's models are tiny (a block all-gathers 17 KB): a link scaled to them, so that one block's
    # transfer takes about what its compute does on this machine, as a large layer's does on a GPU node
    "notebook": Link(2e-3, 1e6),
    "slow": Link(10e-3, 0.5e6),  # communication far above compute: overlap hides little
    "lan": Link(0.1e-3, 100e6),  # a 1 Gb/s Ethernet: far below the workbook's compute, nothing to hide
}
"""Named links for ``launch.run(..., link="notebook")`` and ``--link notebook``."""

_TIME_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6}  # divisors: 100 us is 1e-4 exactly as written
_RATE_UNITS = {"B/s": 1.0, "kB/s": 1e3, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9}
_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?"
_LINK_TEXT = re.compile(rf"^\s*({_NUMBER})\s*(s|ms|us|µs)\s*,\s*({_NUMBER})\s*(B/s|kB/s|KB/s|MB/s|GB/s)\s*$")


def parse_link(value: Link | str | None) -> Link | None:
    """A link from a ``Link``, a preset name (``LINK_PRESETS``), 'LATENCY,RATE' such as '2ms,1MB/s', or
    None / 'none' (no emulation); ``ValueError`` naming the accepted forms otherwise."""
    if value is None or isinstance(value, Link):
        return value
    if isinstance(value, str):
        if value.strip().lower() in ("", "none", "off"):
            return None
        if value.strip() in LINK_PRESETS:
            return LINK_PRESETS[value.strip()]
        match = _LINK_TEXT.match(value)
        if match:
            latency, time_unit, rate, rate_unit = match.groups()
            return Link(float(latency) / _TIME_UNITS[time_unit], float(rate) * _RATE_UNITS[rate_unit])
    raise ValueError(
        f"link must be None, a Link(latency_s, bytes_per_s), a preset ({', '.join(LINK_PRESETS)}) or "
        f"'LATENCY,RATE' such as '2ms,1MB/s' (units s, ms, us; B/s, kB/s, MB/s, GB/s), got {value!r}"
    )


@dataclass
class LinkClock:
    """The emulated link of one rank's run: when each group's link is next free (``time.monotonic``)."""

    link: Link
    free_at: dict[str, float] = field(default_factory=dict)

    def reserve(self, op: str, group: str, group_size: int, nbytes: float) -> float:
        """The emulated end of a collective issued now: after the group's previous one, α + n·β."""
        start = max(time.monotonic(), self.free_at.get(group, 0.0))
        end = start + self.link.seconds(op, group_size, nbytes)
        self.free_at[group] = end
        return end


_clock: contextvars.ContextVar[LinkClock | None] = contextvars.ContextVar("hyper_parallel_link", default=None)


@contextlib.contextmanager
def emulating(link: Link | None) -> Iterator[LinkClock | None]:
    """Every collective issued inside the block through ``hyper_parallel.comm`` (or traced from torch's
    DTensor) completes no earlier than its emulated end; None: no emulation."""
    if link is None:
        yield None
        return
    token = _clock.set(LinkClock(link))
    try:
        yield _clock.get()
    finally:
        _clock.reset(token)


def reserve(op: str, group: str, group_size: int, nbytes: float) -> float | None:
    """The emulated end (``time.monotonic`` seconds) of a collective issued now, or None without a link."""
    clock = _clock.get()
    return None if clock is None else clock.reserve(op, group, group_size, nbytes)


def hold_until(end: float | None) -> None:
    """Sleep until the emulated end (no CPU burnt); returns at once when it has passed or is None."""
    if end is None:
        return
    remaining = end - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


def is_done(end: float | None) -> bool:
    """Whether the emulated end has passed (None: no link, always)."""
    return end is None or time.monotonic() >= end
