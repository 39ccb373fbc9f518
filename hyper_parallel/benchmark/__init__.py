"""Our extended ``fully_shard`` against torch's own FSDP2, side by side in one run (``python -m launch bench``).

``configs``   what is compared (torch-free: the launcher validates and summarises without torch)
``worker``    the torchrun entry: both implementations on one model, steps alternated A B B A ...
``measure``   what a step costs: wall time, peak memory, the collectives torch FSDP2 issues
``collectives`` the five collectives timed on every rank of a group, for notebook 00b's alpha-beta fit
              (``cost_model.alpha_beta``)
"""
