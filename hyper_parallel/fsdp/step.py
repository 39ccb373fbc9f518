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


IDLE, FORWARD = TrainingState.IDLE, TrainingState.FORWARD
PRE_BACKWARD, POST_BACKWARD = TrainingState.PRE_BACKWARD, TrainingState.POST_BACKWARD

TRANSITIONS: frozenset[tuple[TrainingState, TrainingState]] = frozenset(
    {
        (IDLE, FORWARD),  # a forward starts
        (FORWARD, FORWARD),  # the next module of a unit of several, or a unit called twice in one forward
        (POST_BACKWARD, FORWARD),  # the next microbatch's forward (a pipeline schedule) after this one's backward
        (FORWARD, IDLE),  # the unit's forward ends
        (IDLE, PRE_BACKWARD),  # backward reaches the unit's outputs
        (FORWARD, PRE_BACKWARD),  # ... of a call whose pass is still open (a unit used twice)
        (IDLE, POST_BACKWARD),  # backward done with a unit whose outputs it never reached (the embedding)
        (FORWARD, POST_BACKWARD),
        (PRE_BACKWARD, POST_BACKWARD),  # backward done with the unit: its gradients reduced
    }
)
"""Every change of a unit's ``TrainingState`` the lifecycle allows, (from, to). The one move outside it is the
reset to IDLE at the end of a step or after a step that raised (``check_transition(..., reset=True)``)."""


def check_transition(unit: str, now: TrainingState, to: TrainingState, reset: bool = False) -> None:
    """Raise when ``now -> to`` is not in ``TRANSITIONS`` (a hook ran out of order: a bug here, or a training
    loop that calls backward twice on one forward). ``reset``: the end of a step or ``reset_iter_state``, which
    return every unit to IDLE from wherever it is."""
    if reset and to is IDLE:
        return
    if (now, to) not in TRANSITIONS:
        sources = sorted(state.name for state, target in TRANSITIONS if target is to)
        raise RuntimeError(
            f"fully_shard unit {unit!r}: cannot go from {now.name} to {to.name} (only from "
            f"{', '.join(sources)}); if a forward or backward raised before, call reset_iter_state() on the root module"
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
