"""Benchmarks that print ratios measured side by side in one run (docs/performance.md).

fsdp2.py     ``python -m launch bench``: our fully_shard against torch FSDP2 in one launch
latency.py   ``python -m launch bench-latency``: a fresh torchrun launch against the warm pool
flags.py     the two commands' flags and what runs for them
"""
