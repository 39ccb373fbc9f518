"""The recipe worker with its comparison forced to report a mismatch (as a wrong fully_shard would):
tests/test_multi_node.py checks that the job's exit status says so."""

from __future__ import annotations

import hyper_parallel.recipes.worker as worker
from hyper_parallel.rank_lifetime import run_rank

compare = worker.train_and_compare


def mismatching(*args, **kwargs):
    metrics = compare(*args, **kwargs)
    return {**metrics, "ok": False} if metrics else metrics  # rank 0 holds the metrics


worker.train_and_compare = mismatching

if __name__ == "__main__":
    run_rank(worker.main)
