"""One IPython kernel that executes notebook after notebook, as ``make workbook`` runs them.

A fresh kernel per notebook starts a fresh warm pool per notebook too: N interpreters importing torch,
about 11 s of CPU for 4 ranks, the largest cost of the workbook on 2 cores. ``WorkbookKernel`` keeps the
kernel, and with it the pool, and starts each notebook as a fresh kernel would see it:

* the kernel's names, history and execution counter are reset (``InteractiveShell.reset``), its figures
  closed, ``%load_ext launch`` made to load again, the working directory set to the notebook's folder;
* the names ``%%torchrun`` cells defined on the ranks are dropped (``Pool.forget_names``);
* the pool starts with ``POOL_RANKS`` workers even for a smaller first run, so that no later notebook
  ends it to grow it (``Pool.min_size``);
* after a notebook that failed (or timed out), the kernel is restarted instead, pool and all.

So a notebook that used a name of an earlier one fails here as it would alone. The tests run every
notebook in a kernel of its own (``execute_notebook`` without a kernel), which is what a learner's
*Run All* does.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType

from jupyter_client import KernelManager

KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=CRITICAL"]
"""The kernel's own log is noise here (the TCP-without-encryption warning on loopback, the KeyboardInterrupt
of jupyter_client's shutdown); cell errors still fail the run."""

RESET_SECONDS = 120.0
POOL_RANKS = 4
"""The largest world size the workbook's notebooks ask for at their defaults. A kernel whose pool first
served a 2-rank notebook had to end it and start new workers for its first 4-rank one: a second cold
start, in the middle of that notebook."""

_RESET_CODE = """
def _start_afresh(folder):
    import os, sys
    import launch.processes.pool
    ip = get_ipython()
    ip.reset(new_session=True)
    ip.extension_manager.loaded.discard("launch")
    os.chdir(folder)
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
    launch.processes.pool.current().forget_names()
    launch.processes.pool.current().min_size = {pool_ranks}
_start_afresh({folder})
"""

_WARM_CODE = """
import launch.processes.pool
launch.processes.pool.current().warm_up({pool_ranks})
"""


class WorkbookKernel:
    """A kernel kept across notebooks; ``with WorkbookKernel() as kernel: kernel.manager`` for papermill."""

    def __init__(self) -> None:
        self.manager = None
        self._dirty = False

    def __enter__(self) -> WorkbookKernel:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()

    def prepare(self, folder: Path) -> None:
        """Make the kernel ready for the next notebook in ``folder``: started, or reset, or replaced."""
        if self.manager is None or self._dirty or not self.manager.is_alive():
            self._start(folder)
        if not self._execute(_RESET_CODE.format(folder=json.dumps(str(folder)), pool_ranks=POOL_RANKS)):
            self._start(folder)  # a kernel that cannot be reset is replaced
        self._dirty = True  # until ``finished`` says the notebook ran through

    def warm(self, folder: Path) -> None:
        """Start the kernel and its pool's ``POOL_RANKS`` workers ahead of its first notebook, which then
        pays neither start; ``RuntimeError`` if the pool could not start (the kernel is replaced then)."""
        self.prepare(folder)
        ok = self._execute(_WARM_CODE.format(pool_ranks=POOL_RANKS))
        self.finished(ok)
        if not ok:
            raise RuntimeError("the kernel's warm pool did not start")

    def finished(self, ok: bool) -> None:
        """The notebook ran through (the kernel is reset for the next) or not (it is replaced). The client
        papermill opened is closed here: nbclient leaves it open when it does not own the kernel, and each
        one kept 12 fds and its heartbeat thread."""
        self._dirty = not ok
        self.manager.close_clients()

    def _start(self, folder: Path) -> None:
        """A new kernel (so no warm pool yet), ending the one before. A new manager with new ports: a
        kernel restarted in place (``restart_kernel``) did not answer a new client within 30 s."""
        self.close()
        self.manager = _ClientsKept(kernel_name="python3")
        self.manager.start_kernel(extra_arguments=KERNEL_ARGUMENTS, cwd=str(folder))

    def _execute(self, code: str) -> bool:
        """Run ``code`` in the kernel; whether it ran without error."""
        client = self.manager.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=RESET_SECONDS)
            reply = client.execute_interactive(
                code, store_history=False, timeout=RESET_SECONDS, output_hook=lambda _: None
            )
        except (RuntimeError, TimeoutError):
            return False
        finally:
            client.stop_channels()
        return reply["content"]["status"] == "ok"

    def close(self) -> None:
        """End the kernel (and the warm pool it holds)."""
        if self.manager is not None:
            self.manager.close_clients()
            if self.manager.has_kernel:
                self.manager.shutdown_kernel(now=True)
        self.manager = None


class _ClientsKept(KernelManager):
    """A kernel manager that remembers the clients it made, so that they can be closed."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._open_clients: list = []

    def client(self, **kwargs):
        opened = super().client(**kwargs)
        self._open_clients.append(opened)
        return opened

    def close_clients(self) -> None:
        for opened in self._open_clients:
            opened.stop_channels()
        self._open_clients.clear()
