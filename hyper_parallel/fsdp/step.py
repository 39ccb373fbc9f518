"""What a fully_shard unit records during one training step, as data (with ``state.StepContext``, which the
units of one root share).

``BackwardProgress``: one unit's forward calls of this step and how far backward has come
through them. ``TrainingState`` with ``check_transition``: where a unit is in the step, every change checked
(torch FSDP2 asserts its states the same way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto


class TrainingState(Enum):
    """Where a unit is in the step; hooks check it, so a recomputed forward (activation checkpointing)
    inside backward does not reshard parameters that backward is using."""

    IDLE = auto()
    FORWARD = auto()
    PRE_BACKWARD = auto()  # backward has reached the unit: parameters unsharded for it
    POST_BACKWARD = auto()  # backward is done with the unit: gradients reduced (or in flight)


def check_transition(unit: str, now: TrainingState, to: TrainingState, allowed_from: tuple[TrainingState, ...]) -> None:
    """Raise when ``now -> to`` is not a step of the lifecycle (a hook ran out of order: a bug here, or a
    training loop that calls backward twice on one forward)."""
    if now not in allowed_from:
        raise RuntimeError(
            f"fully_shard unit {unit!r}: cannot go from {now.name} to {to.name} (only from "
            f"{', '.join(state.name for state in allowed_from)}); if a forward or backward raised before, "
            "call reset_iter_state() on the root module"
        )


@dataclass
class BackwardProgress:
    """One unit's forward calls with gradients in this step and how far backward has come through them.

    Backward is done with the unit once the gradients of the inputs of every forward call are computed:
    by then every weight's gradient is accumulated and no backward node of the unit is left, frozen weights
    included. That moment depends only on the graph's structure, never on which gradients a rank
    happened to compute, so every rank reduces the unit at the same point of its sequence of collectives.
    A unit none of whose inputs needs a gradient (the embedding) is done at the end of backward. Calls may
    outlive one backward (a pipeline schedule runs several microbatches' forwards before their backwards),
    so ``inputs_pending`` is kept across backwards and cleared only by ``reset()`` after a failed step.
    """

    inputs_pending: int = 0  # forward calls whose input gradients backward has not computed yet
    modules_run: set[int] = field(default_factory=set)  # which of the unit's modules ran this forward

    def reset(self) -> None:
        self.inputs_pending = 0
        self.modules_run.clear()

    def input_gradients_done(self) -> bool:
        """One forward call's input gradients were computed; True once every call's are."""
        self.inputs_pending = max(0, self.inputs_pending - 1)
        return self.inputs_pending == 0
