"""The only code of ``launch`` that starts or ends a process: torchrun on loopback, the warm pool, their logs.

supervisor.py      one torchrun launch: the command, its output read live, a timeout, the whole tree ended
local_agent.py     torchrun itself, listening on 127.0.0.1 only and dying with the launcher
log_layout.py      where torchrun (and the pool, for its runs) writes each rank's logs and error files
failure_report.py  which rank to blame when a launch fails, and the lines that show why
run_dirs.py        a run directory no concurrent launch shares; scratch that is cleaned
pool.py            the warm pool: workers that stay up between runs (pool_worker.py is one rank,
                   pool_listener.py where they connect, pool_health.py what they hold)
"""
