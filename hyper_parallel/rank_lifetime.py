"""How a torchrun rank ends: with its agent, and without an abort in the interpreter's teardown.

Every rank started by ``launch.torchrun`` runs through this module,

    python -m hyper_parallel.rank_lifetime (PATH | -m MODULE) [ARGS...]

which ties the rank to its torchrun agent, runs the target as ``__main__`` and leaves through
``exit_rank``.  Worker entry points also call ``run_rank(main)`` themselves, so they exit the same
way when started by plain ``torchrun`` (multi-node).

Why not a normal interpreter exit (measured with torch 2.13 on CPU/gloo): after
``destroy_process_group()`` the gloo threads of every group torch FSDP2 ever used keep running
(FSDP2 still references the groups), and the first ``torch.profiler`` session starts kineto's
config thread, a process-lifetime singleton.  Python's finalization and the C++ static
destructors then run while those threads do, and on a loaded machine that ended a finished
benchmark rank with "terminate called without an active exception" (SIGABRT).  So a rank
destroys its process groups, runs the ``atexit`` handlers, flushes its output and leaves with
``os._exit``: no teardown runs, so none can abort.

An uncaught exception is recorded first, as torch's ``@record`` does, in the JSON error file torchrun's
agent names in ``TORCHELASTIC_ERROR_FILE`` (``<log dir>/<run id>/attempt_N/<rank>/error.json``:
``{"message": {"message": "Type: text", "extraInfo": {"py_callstack": ..., "timestamp": ...}}}``),
which the launcher reads to name the failing rank and its traceback (``launch.processes.failure_report``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import runpy
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

AGENT_PID_ENV = "HYPER_PARALLEL_AGENT_PID"
STATUS_DIR_ENV = "HYPER_PARALLEL_STATUS_DIR"
FINISHED_FILE = "finished_rank{rank}"
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # set per rank by torchrun's agent
ERROR_FILE = "error.json"  # its name in the rank's log folder
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(expected_parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent ends; exit now if it already has.

    Linux only (the kernel call exists nowhere else); elsewhere this is a no-op.  Checking the
    parent after the ``prctl`` closes the race of a parent that died before the request.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != expected_parent:
        os._exit(1)


def tie_to_agent() -> None:
    """Under ``launch.torchrun``: this rank is SIGKILLed as soon as its torchrun agent is gone."""
    agent = os.environ.get(AGENT_PID_ENV)
    if agent:
        die_with_parent(int(agent))


def _record_finished(code: int) -> None:
    """Tell the launcher this rank's work ended (with ``code``): a signal after this is a crash at exit."""
    status_dir, rank = os.environ.get(STATUS_DIR_ENV), os.environ.get("RANK")
    if status_dir and rank is not None:
        Path(status_dir, FINISHED_FILE.format(rank=rank)).write_text(str(code))


def exit_rank(code: int, work_finished: bool = True) -> NoReturn:
    """Leave this rank with exit ``code`` and no interpreter teardown (see the module docstring).

    After finished work the process groups are destroyed first; after a failure they are left
    alone, since the other ranks may still be inside a collective with this one.
    """
    if work_finished:
        _record_finished(code)
    if work_finished and code == 0 and "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    atexit._run_exitfuncs()  # what a normal exit runs first (logging.shutdown, user handlers)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    ctypes.CDLL(None).fflush(None)  # C/C++ stdio buffers too (exit() would flush them; _exit does not)
    os._exit(code)


def _exit_code(exit: SystemExit) -> int:
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


def record_error(error: BaseException) -> None:
    """Write ``error`` (being handled) to this rank's error file, as torch's ``@record`` decorator does.

    torch's ``ErrorHandler.record_exception`` writes it, in torch's format; torch is imported here, on
    failure only, so a rank's own imports keep their order.  Without ``TORCHELASTIC_ERROR_FILE`` (not
    under torchrun) nothing is written.  A failure to write is printed, never raised: the rank's
    traceback still reaches its log, which the launcher reads when there is no error file.
    """
    if not os.environ.get(ERROR_FILE_ENV):
        return
    try:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(error)
    except Exception as failure:  # the rank is failing already; its log still has the traceback
        print(f"could not write the error file {os.environ[ERROR_FILE_ENV]}: {failure!r}", file=sys.stderr)


def run_rank(main: Callable[[], int | None]) -> NoReturn:
    """Run a worker's ``main`` as a rank: tied to its agent, and ended by ``exit_rank``.

    A return value or ``sys.exit`` code becomes the exit code; an exception is recorded in the rank's
    error file (``record_error``, what torch's ``@record`` would do, before ``os._exit`` can skip it),
    printed by ``sys.excepthook`` (torch's, which names the rank) and exits with 1.
    """
    tie_to_agent()
    try:
        code = main()
    except SystemExit as exit:
        code = _exit_code(exit)
    except BaseException as error:  # recorded and reported, then the rank fails like an uncaught exception
        record_error(error)
        sys.excepthook(*sys.exc_info())
        exit_rank(1, work_finished=False)
    exit_rank(code if isinstance(code, int) else 0)


def _target(argv: list[str]) -> Callable[[], None]:
    """``PATH`` or ``-m MODULE`` (then its arguments), run as ``__main__`` like ``python`` would."""
    if argv[:1] == ["-m"] and len(argv) >= 2:
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]

        def run_module() -> None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)

        return run_module
    if argv and not argv[0].startswith("-"):
        path, args = argv[0], argv[1:]
        sys.argv = [path, *args]
        sys.path[0] = str(Path(path).resolve().parent)  # as for `python PATH`: the script's folder first

        def run_script() -> None:
            runpy.run_path(path, run_name="__main__")

        return run_script
    raise SystemExit(f"usage: python -m {__spec__.name} (PATH | -m MODULE) [ARGS...]; got {argv}")


if __name__ == "__main__":
    run_rank(_target(sys.argv[1:]))
