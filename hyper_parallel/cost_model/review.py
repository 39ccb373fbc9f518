"""Named layouts side by side, as a design review compares them: one evaluation per candidate, ranked
by step time within the memory budget, with ties, the Pareto front and warnings.

    review = review_layouts(get_model("llama-8b-like"), parse_layouts("dp_shard=512; dp_shard=64,tp=8", 512),
                            gpus_per_node=8, hardware=get_hardware("h100-nvl8-ndr"))
    review[0].row()          # a flat dict: the CSV / JSON row (exact bytes and seconds)

Ties: the model's bandwidths and efficiencies are nominal, so step times closer than ``RESOLUTION``
(5 %) of the faster one are not told apart: they share a rank ("2=") instead of being ordered.
Pareto: a candidate within the budget is on the front when no other one within the budget is at
least as fast and as small with one of them strictly better.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hyper_parallel.cost_model import CostEstimate, ModelConfig, estimate
from hyper_parallel.cost_model.hardware import Hardware
from hyper_parallel.cost_model.layouts import GIB, nodes_spanned
from hyper_parallel.cost_model.step_time import StepEstimate, estimate_step
from hyper_parallel.cost_model.validation import check_degrees_divide
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import DEGREE_NAMES

RESOLUTION = 0.05
PADDING_WARNING = 1.10  # warn when the all-gather buffers hold 10 % more than the unpadded parameters
TIGHT_BUDGET = 0.90  # and when a plan uses more than 90 % of the budget


def parse_layouts(text: str, world_size: int) -> list[ParallelDims]:
    """``"dp_shard=512; dp_replicate=64,dp_shard=8"``: candidates split by ';', degrees by ','. A degree left
    out is 1, except dp_shard, which ``ParallelDims`` infers; ``ValueError`` names the broken candidate."""
    layouts = []
    for index, chunk in enumerate(part.strip() for part in text.split(";")):
        if not chunk:
            continue
        degrees: dict[str, int] = {}
        for item in (piece.strip() for piece in chunk.split(",")):
            name, _, value = item.partition("=")
            name = name.strip().replace("-", "_")
            if name not in DEGREE_NAMES or not value.strip().isdigit():
                raise ValueError(
                    f"--layouts candidate {index + 1} ({chunk!r}): {item!r} is not NAME=INTEGER with "
                    f"NAME one of {', '.join(DEGREE_NAMES)}"
                )
            if name in degrees:
                raise ValueError(
                    f"--layouts candidate {index + 1} ({chunk!r}) names {name} twice ({name}={degrees[name]} and "
                    f"{item}); give each degree once, e.g. {name}={degrees[name]}"
                )
            degrees[name] = int(value)
        try:
            check_degrees_divide(world_size, degrees)
            layouts.append(ParallelDims(world_size=world_size, **degrees))
        except ValueError as error:
            raise ValueError(f"--layouts candidate {index + 1} ({chunk!r}): {error}") from None
    if not layouts:
        raise ValueError('--layouts needs at least one candidate, e.g. "dp_shard=512; dp_replicate=64,dp_shard=8"')
    return layouts


def padding_inflation(cost: CostEstimate) -> tuple[float, str]:
    """(stored / unpadded parameter elements per rank, the parameter with the most padding elements): FSDP
    pads every parameter's sharded axis to a multiple of the shard size."""
    padded = sum(u.gathered_numel for u in cost.units)
    local = sum(u.local_numel for u in cost.units)
    worst = max(
        (
            (p.padded_numel(u.shard_size) - p.local_numel, f"{u.name}.{p.name}", p, u)
            for u in cost.units
            for p in u.params
        ),
        key=lambda item: item[0],
    )
    _, name, param, unit = worst
    axis = param.fsdp_axis()
    return padded / local, (
        f"{name} {list(param.local_shape)} sharded {unit.shard_size} ways on dim {axis} "
        f"({param.local_shape[axis]} rows)"
    )


def warnings_of(cost: CostEstimate, hardware: Hardware, gpus_per_node: int) -> list[str]:
    result = []
    budget = hardware.budget_bytes
    if cost.memory.total > budget:
        result.append(
            f"over budget: {cost.memory.total / GIB:.1f} GiB per rank > {budget / GIB:.1f} GiB "
            f"({hardware.memory_gib:g} GiB - {hardware.reserve_gib:g} GiB reserve)"
        )
    elif cost.memory.total > TIGHT_BUDGET * budget:
        result.append(f"tight: {cost.memory.total / budget:.0%} of the {budget / GIB:.1f} GiB budget")
    inflation, worst = padding_inflation(cost)
    if inflation > PADDING_WARNING:
        result.append(
            f"padding: the all-gather buffers hold {inflation:.1f}x the parameters; worst {worst}"
            + ("; shard experts inside each expert (expert shard dim 1) or use ep" if cost.config.is_moe else "")
        )
    for group in ("tp", "etp"):
        if getattr(cost.dims, group) > 1 and nodes_spanned(cost.dims, group, gpus_per_node) > 1:
            result.append(
                f"{group}={getattr(cost.dims, group)} spans nodes with {gpus_per_node} GPUs per node: "
                f"its critical-path collectives run at the inter-node bandwidth"
            )
    return result


@dataclass
class CandidateReview:
    cost: CostEstimate
    step: StepEstimate
    fits: bool
    warnings: list[str]
    rank: int = 0  # 1 = fastest within the budget; ties share one
    tied: bool = False
    pareto: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.cost.dims.label()

    @property
    def rank_text(self) -> str:
        return f"{self.rank}=" if self.tied else str(self.rank)

    def row(self) -> dict:
        """Exact values: bytes, seconds, FLOPs; one flat level except the per-group dicts."""
        step, cost = self.step, self.cost
        row = {
            "layout": self.label,
            **{k: v for k, v in cost.dims.degrees().items()},
            "rank": self.rank,
            "tied": self.tied,
            "fits": self.fits,
            "pareto": self.pareto,
        }
        row |= {f"memory_{k}_bytes": v for k, v in cost.memory.as_dict().items()}
        row["stage_memory_bytes"] = [s.memory.total for s in cost.stages] or [cost.memory.total]
        row |= {
            "flops_per_rank": step.flops.total,
            "model_flops_per_rank": step.flops.model,
            "recompute_flops_per_rank": step.flops.recompute,
            "compute_s": step.middle.compute,
            "critical_comm_s": step.middle.critical,
            "exposed_comm_s": step.middle.exposed,
            "hidden_comm_s": step.middle.hidden,
            "step_s": step.middle.total,
            "step_fast_s": step.fast.total,
            "step_slow_s": step.slow.total,
            "bubble_s": step.bubble_seconds,
            **{
                f"work_{kind}_s": seconds
                for kind, seconds in (step.middle.work.__dict__ if step.middle.work else {}).items()
            },
            "mfu": step.middle.mfu,
            "mfu_fast": step.fast.mfu,
            "mfu_slow": step.slow.mfu,
            "inter_node_bytes": step.inter_node_bytes,
            "comm_bytes": sum(c.bytes for c in cost.collectives),
        }
        row["exposed_by_group_s"] = {g: s for g, s in step.middle.exposed_by_group.items()}
        row["hidden_by_group_s"] = {g: s for g, s in step.middle.hidden_by_group.items()}
        row["warnings"] = list(self.warnings)
        return row


def _assign_ranks(reviews: list[CandidateReview]) -> None:
    """Fastest first within the budget; a step within RESOLUTION of its group's fastest shares its rank."""
    ordered = sorted(reviews, key=lambda r: (not r.fits, r.step.seconds))
    leader: CandidateReview | None = None
    for position, review in enumerate(ordered, start=1):
        same = (
            leader is not None
            and review.fits == leader.fits
            and review.step.seconds <= leader.step.seconds * (1 + RESOLUTION)
        )
        if same:
            review.rank = leader.rank
            review.tied = leader.tied = True
        else:
            review.rank, leader = position, review
    for review in reviews:
        review.pareto = review.fits and not any(
            other.fits
            and other.step.seconds <= review.step.seconds
            and other.cost.memory.total <= review.cost.memory.total
            and (other.step.seconds, other.cost.memory.total) != (review.step.seconds, review.cost.memory.total)
            for other in reviews
        )


def review_layouts(
    config: ModelConfig, layouts: list[ParallelDims], gpus_per_node: int, hardware: Hardware
) -> list[CandidateReview]:
    """Each layout costed (``estimate``), timed (``step_time``) and warned about, in the given order, with
    its rank, tie and Pareto flags set; ``ValueError`` names a layout the model does not fit."""
    reviews = []
    for dims in layouts:
        try:
            cost = estimate(config, dims)
        except ValueError as error:
            raise ValueError(f"layout {dims.label()}: {error}") from None
        reviews.append(
            CandidateReview(
                cost,
                estimate_step(cost, gpus_per_node, hardware),
                cost.memory.total <= hardware.budget_bytes,
                warnings_of(cost, hardware, gpus_per_node),
            )
        )
    _assign_ranks(reviews)
    return reviews
