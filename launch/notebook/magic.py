"""``%%torchrun``: a notebook cell's code on N ranks of the warm pool, as ``%%px`` does for ipyparallel.

    %load_ext launch
    %%torchrun -n 4 [--timeout 120]
    x = torch.ones(1) * rank
    dist.all_reduce(x)
    x.item()                      # the cell's value: [6.0, 6.0, 6.0, 6.0], one per rank

On every rank ``torch.distributed`` is initialised (gloo on CPU, NCCL with GPUs) and ``rank``,
``world_size``, ``torch`` and ``dist`` are defined; ``--send a,b`` defines the kernel's variables ``a`` and
``b`` there too (JSON data: numbers, strings, lists, dicts); ``--out name`` stores the per-rank values in
the kernel variable ``name`` instead of displaying them. Each rank's output is shown as it comes, prefixed
with its rank. Names a cell defines stay on the workers for the next cell, until ``%torchrun --restart``.
A cell that raises on one or all ranks: its traceback is shown and the names stay; a SyntaxError is
caught here, before anything is sent. Only a rank that died or hung past ``--timeout``, an interrupt
during a cell, or a cell needing more ranks than the pool has ends the workers, and the next cell says
that the names are gone and why. Values come back through ``torch.save`` bytes read with
``weights_only=True`` (tensors, numbers, strings, lists and dicts of them); anything else as its ``repr``.
One machine only: ``-n`` is capped at cores x 8 (``HYPER_PARALLEL_MAX_RANKS`` overrides it).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import shlex
import sys

from launch import inputs
from launch.processes.pool import PoolError, current, shutdown_pool

DEFAULT_TIMEOUT = 300.0
USAGE = "usage: %%torchrun -n N [--timeout SECONDS] [--send a,b] [--out NAME]   |   %torchrun --restart"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="%%torchrun", add_help=False)
    parser.add_argument("-n", "--nproc", type=int, action=inputs.Once, help="number of ranks")
    parser.add_argument("--timeout", type=float, action=inputs.Once, help="seconds before the ranks are ended")
    parser.add_argument("--restart", action="store_true", help="end the warm workers (their names are forgotten)")
    parser.add_argument(
        "--send", action=inputs.Once, help="comma-separated kernel variables (JSON data) to define on every rank"
    )
    parser.add_argument(
        "--out", action=inputs.Once, help="kernel variable to store the per-rank values in (nothing is displayed)"
    )
    return parser


def decode(reply: dict):
    """One rank's cell value in the kernel."""
    if "value" in reply:
        if reply["value"] is None:
            return None
        import torch  # the kernel imports torch only when a cell returns a value

        return torch.load(io.BytesIO(base64.b64decode(reply["value"])), weights_only=True)
    return reply.get("repr")


def run_cell(code: str, nproc: int, timeout: float = DEFAULT_TIMEOUT, stream=None, send: dict | None = None) -> list:
    """The cell on ``nproc`` ranks, after defining ``send``'s names there; its value on each rank (a list
    indexed by rank). ``ValueError`` for bad input or a SyntaxError (nothing is sent); ``PoolError`` if a
    rank failed (``kept``: the pool and its names survived)."""
    inputs.rank_count(nproc, "-n")
    inputs.timeout(timeout, "--timeout")
    try:
        compile(code, "<%%torchrun cell>", "exec")
    except SyntaxError as error:
        raise ValueError(
            f"the cell does not compile, so it was not sent (the workers and their names are untouched):\n"
            f"  line {error.lineno}: {(error.text or '').rstrip()}\nSyntaxError: {error.msg}"
        ) from None
    if send:
        for name, value in send.items():
            inputs.json_names(value, f"--send {name}")
        try:
            code = (
                "".join(
                    f"{name} = __import__('json').loads({json.dumps(json.dumps(value))})\n"
                    for name, value in send.items()
                )
                + code
            )
        except TypeError as error:
            raise ValueError(f"--send takes JSON data (numbers, strings, lists, dicts): {error}") from None
    out = stream or sys.stdout

    def show(rank: int, line: str) -> None:
        if rank >= 0:
            out.write(f"[rank {rank}] {line}\n")
            out.flush()

    pool = current()
    try:
        replies, _, _ = pool.run(nproc, {"kind": "code", "code": code}, timeout, show)
    finally:
        if pool.restarted_because:
            print(f"new warm workers: {pool.restarted_because}, so earlier names are gone", file=sys.stderr)
    return [decode(reply) for reply in replies]


def torchrun_magic(line: str, cell: str | None = None):
    """The ``%%torchrun`` cell magic and the ``%torchrun --restart`` line magic."""
    try:
        args = _parser().parse_args(shlex.split(line))
    except ValueError as error:  # shlex: an unclosed quote
        print(f"{USAGE}\n%%torchrun's line: {error} (close the quotation)", file=sys.stderr)
        return None
    except SystemExit:
        print(USAGE, file=sys.stderr)
        return None
    args.timeout = DEFAULT_TIMEOUT if args.timeout is None else args.timeout
    args.send, args.out = args.send or "", args.out or ""
    if args.restart:
        shutdown_pool()
        print("warm workers ended; the next %%torchrun cell starts new ones")
        return None
    if cell is None or args.nproc is None:
        print(USAGE + " (a cell magic: the code goes below it)", file=sys.stderr)
        return None
    try:
        if args.out:
            inputs.identifier(args.out, "--out")
    except ValueError as error:
        print(str(error), file=sys.stderr)
        return None
    namespace = _user_namespace()
    names = [name.strip() for name in args.send.split(",") if name.strip()]
    missing = [name for name in names if name not in namespace]
    if missing:
        print(f"--send: no kernel variable named {', '.join(missing)}", file=sys.stderr)
        return None
    try:
        values = run_cell(cell, args.nproc, args.timeout, send={name: namespace[name] for name in names})
    except (PoolError, ValueError) as error:  # shown, not raised: the kernel stays usable
        print(str(error), file=sys.stderr)
        return None
    if args.out:
        namespace[args.out] = values
        return None
    return values


def _user_namespace() -> dict:
    from IPython import get_ipython

    shell = get_ipython()
    return shell.user_ns if shell is not None else {}


def load_ipython_extension(ipython) -> None:
    ipython.register_magic_function(torchrun_magic, "line_cell", "torchrun")
