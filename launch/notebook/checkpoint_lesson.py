"""Notebook 05's resharding lesson: what ``hyper_parallel.benchmark.reshard_probe`` found, in words."""

from __future__ import annotations


def _layout(pieces: dict) -> str:
    mesh = " x ".join(f"{name}={size}" for name, size in pieces["mesh"].items())
    return f"{tuple(pieces['placements'])} on ({mesh}), this rank's piece {pieces['local_shape']} of {pieces['global_shape']}"


def reshard_text(found: dict) -> str:
    """The watched parameter's layout at the save and at the load, the losses of both runs after the save,
    and their largest difference."""
    difference = max(abs(a - b) for a, b in zip(found["straight"], found["resumed"]))
    return "\n".join(
        [
            f"saved as:  {_layout(found['saved_as'])}",
            f"loaded as: {_layout(found['loaded_as'])}",
            f"losses before the save:           {found['before']}",
            f"after it, never stopped (FSDP 4): {found['straight']}",
            f"after it, resumed (HSDP 2 x 2):   {found['resumed']}",
            f"first loss after the load bit-equal: {found['straight'][0] == found['resumed'][0]}; "
            f"max |resumed - never stopped| = {difference:.1e}",
        ]
    )
