"""What a recipe's worker builds, as data on its registry row (torchtitan's ``ModelSpec`` plays this part).

Readers that must know how a recipe parallelizes its model read these facts, never the name of its
implementation: the cost model describes the run by them (``cost_model.recipe_model``) and
tests/test_recipes.py derives the collectives of one training step from them by hand, so a row whose
facts say something its implementation does not do fails there against the traces. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SequenceScheme(StrEnum):
    """How the cp ranks attend over the whole sequence; the token layout is the same, so are the numbers.

    A scheme has code in parallel/ (its attention), recipes/transformer.py (which attention it picks),
    cost_model/communication.py (its bytes) and viz/volume.py (its colour)."""

    ALL_GATHER = "all_gather"  # K/V all-gathered over cp (M5, M6)
    RING = "ring"  # K/V blocks passed around the cp ring, cp-1 shifts (M5-R)
    ULYSSES = "ulysses"  # q/k/v resharded from sequence to heads by all-to-all (M5-U, M6-U)

    @property
    def label(self) -> str:
        """How figures and tables name it."""
        return {"all_gather": "K/V all-gather", "ring": "K/V ring", "ulysses": "Ulysses all-to-all"}[self.value]


DISPATCHES = ("all_to_all", "all_gather")
"""How a MoE layer sends tokens to the ranks holding their experts (S1/S2 and S3)."""
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev")
"""torch.distributed.pipelining's schedules the pipeline recipes run (parallel/pipeline.py)."""


@dataclass(frozen=True)
class WorkloadFacts:
    """The model a recipe trains and how it is parallelized beyond what its degrees say."""

    preset: str | None  # the cost model's name of the model (cost_model/presets.py); None: it describes no such run
    moe: bool = False  # a MoE layer whose experts spread over ep
    param_shard: bool | None = None  # fully_shard's enable_param_shard: None shards where a shard dim > 1
    sequence_parallel: bool | None = None  # SP in the TP blocks; None: wherever tp > 1
    sequence_scheme: SequenceScheme = SequenceScheme.ALL_GATHER  # the attention of cp > 1
    dispatch: str = "all_to_all"  # MoE only: one of DISPATCHES
    schedule: str | None = None  # pipeline recipes: one of PIPELINE_SCHEDULES; None: no pipeline
    async_tp: bool = False  # TP+SP's block gathers / scatters cut into tp chunks (parallel/async_tp.py)
    float8: bool = False  # block linears in float8, their tp / fsdp gathers too (parallel/float8.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sequence_scheme", SequenceScheme(self.sequence_scheme))
        if self.dispatch not in DISPATCHES:
            raise ValueError(f"dispatch must be one of {DISPATCHES}, got {self.dispatch!r}")
        if self.schedule is not None and self.schedule not in PIPELINE_SCHEDULES:
            raise ValueError(f"schedule must be one of {PIPELINE_SCHEDULES} or None, got {self.schedule!r}")

    def model_changes(self) -> dict[str, object]:
        """The cost model's ``ModelConfig`` fields these facts set on the preset."""
        return {
            "param_shard": self.param_shard,
            "sequence_parallel": self.sequence_parallel,
            "sequence_scheme": self.sequence_scheme,
            "dispatch": self.dispatch,
        }
