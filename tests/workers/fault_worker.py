"""Worker for tests/test_launcher.py: a 2-rank gloo all_reduce with one injected fault.

Mode (argv[1]): ``ok``; ``raise`` (rank 1 raises); ``sigkill`` (rank 1 SIGKILLs itself);
``exit`` (rank 1 exits with code 3, no traceback); ``hang`` (rank 1 never enters the
all_reduce, so rank 0 waits in it until the launcher's timeout ends the run); ``abort_at_exit``
(rank 1 finishes like ``ok``, then an exit handler aborts it, as a C++ thread still joinable at
interpreter exit would).

Each rank first writes "<pid> <torchrun pid>" to $HYPER_PARALLEL_RUN_DIR/pid_rank<R>, before
the slow torch import, so the test can check that no process outlives the launcher.
"""

import atexit
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

mode = sys.argv[1]
rank = int(os.environ["RANK"])
Path(os.environ["HYPER_PARALLEL_RUN_DIR"], f"pid_rank{rank}").write_text(f"{os.getpid()} {os.getppid()}")
print(f"rank {rank} started", flush=True)

import torch  # after the pid file on purpose
import torch.distributed as dist

# Long collective timeout: a hang must be ended by the launcher's timeout, not by gloo's.
dist.init_process_group("gloo", timeout=timedelta(minutes=10))
if rank == 1 and mode == "raise":
    raise RuntimeError("injected failure on rank 1")
if rank == 1 and mode == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
if rank == 1 and mode == "exit":
    sys.exit(3)
if rank == 1 and mode == "hang":
    time.sleep(3600)
print(f"rank {rank} entering all_reduce", flush=True)
total = torch.ones(1)
dist.all_reduce(total)
print(f"rank {rank} sum {total.item():g}")
dist.destroy_process_group()
if rank == 1 and mode == "abort_at_exit":
    print("rank 1 registers an abort at exit", file=sys.stderr, flush=True)
    atexit.register(os.abort)
