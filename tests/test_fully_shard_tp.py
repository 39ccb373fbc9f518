"""fully_shard under torch's DTensor tensor parallelism, on 8 ranks (docs/design.md §3): TP on tp and
fully_shard on (dp_replicate, fsdp), checked against the single-process reference and torch FSDP2 + TP
(numbers), the hand-derived collectives, GroupInfo and placement transitions (only the fsdp entry changes,
the TP placement seen in forward stays); and experts that are DTensors on (ep, etp) sharded on efsdp next to
a TP dense block, checked against the reference and the hand-derived efsdp / fsdp collectives.

Each case reads as a specification: the function the ranks run (``@case``; tests/fully_shard_worker.py
runs every case of a world size in one launch per session) sits above the tests that assert on what it
recorded.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from fully_shard_expectations import (
    ALL_NAMES,
    BLOCK_TP2_S2,
    BLOCK_TP2_S4,
    EXPERTS_S2,
    MESH8_FSDP,
    MESH8_REP,
    ROOT_PARAMS,
    ROOT_S4,
    assert_collectives,
    assert_group_facts,
    assert_numbers,
    fsdp_unit,
    hsdp_step,
    placements,
    split_placements,
    unit_transitions,
)
from fully_shard_training import (
    CONFIG,
    NUM_EXPERTS,
    Result,
    apply_ours,
    apply_torch,
    batch,
    case,
    full_grads,
    mse,
    new_mlp,
    param_facts,
    placements_str,
    this_rank,
    tp_plan,
    train_side_by_side,
    train_with_torch_fsdp2,
)
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import parallelize_module

from hyper_parallel.fsdp import clip_grad_norm_, fully_shard
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import build_mesh
from hyper_parallel.models.mlp import MLPBlock

# ------------------------------------------------------------------ what the ranks run: shared pieces


class Experts(nn.Module):
    """``num_experts`` linear experts ``[E, d, d]``; every token goes through every expert, outputs are
    averaged (a fixed uniform gate keeps the test about layouts, not routing). With a DTensor weight
    on (ep, etp) = (Shard(0), Shard(2)) the forward runs on DTensor ops: the replicated tokens meet
    this rank's experts' output columns, ``full_tensor()`` gathers the result."""

    def __init__(self, num_experts: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_experts, dim, dim) * dim**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        tokens = x.reshape(1, -1, x.shape[-1]).expand(weight.shape[0], -1, -1)
        if isinstance(weight, DTensor):
            tokens = DTensor.from_local(
                tokens, weight.device_mesh, [Replicate()] * weight.device_mesh.ndim, run_check=False
            )
            out = torch.bmm(tokens, weight).full_tensor()
        else:
            out = torch.bmm(tokens, weight)
        return out.mean(0).reshape(x.shape[:-1] + (weight.shape[-1],))


class DenseAndExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(CONFIG.d_in, CONFIG.d_model)
        self.block = MLPBlock(CONFIG.d_model, CONFIG.hidden)
        self.experts = Experts(NUM_EXPERTS, CONFIG.d_model)
        self.head = nn.Linear(CONFIG.d_model, CONFIG.d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.experts(self.block(self.inp(x))))


pytestmark = pytest.mark.distributed

# ================================================================== dp x tp (8 ranks)


@case("hsdp_with_dtensor_tp", 8)
def dp_tp(res: Result) -> None:
    """(dp_replicate=2, fsdp=2, tp=2): torch TP (ColwiseParallel w1, RowwiseParallel w2) then
    fully_shard on (dp_replicate, fsdp). In forward the TP placement stays (w1 is a DTensor on tp with
    Shard(0)); backward: RS on fsdp + AR on dp_replicate. Equal to the reference and to torch FSDP2+TP."""
    dims = ParallelDims(world_size=8, dp_replicate=2, dp_shard=2, tp=2)
    views = build_mesh(dims, "cpu")
    model = new_mlp(3)
    reference, theirs = copy.deepcopy(model), copy.deepcopy(model)
    for m in (model, theirs):
        for block in m.blocks:
            parallelize_module(block, views[MeshDim.TP], tp_plan())
    apply_ours(model, views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    apply_torch(theirs, views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    res.facts["params"] = param_facts(model)
    res.facts["forward_w1"] = {}

    def seen(module, args):
        w = module.weight
        res.facts["forward_w1"][str(len(res.facts["forward_w1"]))] = {
            "type": type(w).__name__,
            "mesh_dims": list(w.device_mesh.mesh_dim_names) if isinstance(w, DTensor) else [],
            "placements": placements_str(w.placements) if isinstance(w, DTensor) else "",
            "local_shape": list((w.to_local() if isinstance(w, DTensor) else w).shape),
        }

    model.blocks[0].w1.register_forward_pre_hook(seen)
    train_with_torch_fsdp2(res, dims, model, theirs, reference, data_seed=14)


def test_hsdp_with_dtensor_tp_numbers_match_reference_and_torch_fsdp2_tp(fully_shard_run8):
    results = fully_shard_run8.case("hsdp_with_dtensor_tp")
    assert_numbers(results, "ours-ref")
    assert_numbers(results, "torch-ref")
    assert_numbers(results, "ours-torch")


def test_hsdp_with_dtensor_tp_keeps_tp_placement_and_reduces_on_dp_groups(fully_shard_run8):
    """Forward sees w1.weight as a DTensor on tp with Shard(0) (TP placement kept); unshard gathers
    only the fsdp dim; backward: RS on fsdp + AR on dp_replicate, nothing on tp (torch TP's DTensor
    gradients are not partial)."""
    results = fully_shard_run8.case("hsdp_with_dtensor_tp")

    def expected(rank, step):
        return hsdp_step(MESH8_FSDP[rank], MESH8_REP[rank], BLOCK_TP2_S2)

    assert_collectives(results, expected)
    block = {  # name: (mesh dims, sharded, unsharded): only the fsdp entry changes
        "norm.weight": (("dp_replicate", "fsdp"), "(R, S(0))", "(R, R)"),
        "w1.weight": (("dp_replicate", "fsdp", "tp"), "(R, S(1), S(0))", "(R, R, S(0))"),
        "w1.bias": (("dp_replicate", "fsdp", "tp"), "(R, _S(0, 2), S(0))", "(R, R, S(0))"),
        "w2.weight": (("dp_replicate", "fsdp", "tp"), "(R, S(0), S(1))", "(R, R, S(1))"),
        "w2.bias": (("dp_replicate", "fsdp", "tp"), "(R, S(0), R)", "(R, R, R)"),
    }
    root = {name: (("dp_replicate", "fsdp"), "(R, S(0))", "(R, R)") for name in ROOT_PARAMS}
    expected_placements = unit_transitions(root, root=True)
    for b in (0, 1):
        expected_placements += unit_transitions({f"blocks.{b}.{n}": v for n, v in block.items()}, root=False)
    for rank, result in results.items():
        for step in (0, 1):
            assert placements(result, step) == expected_placements, (rank, step)
        assert result["facts"]["forward_w1"] == {
            str(step): {"type": "DTensor", "mesh_dims": ["tp"], "placements": "(S(0))", "local_shape": [32, 32]}
            for step in (0, 1)
        }
    assert_group_facts(
        results,
        ALL_NAMES,
        shard_size=2,
        dp_size=2,
        rank_size=4,
        sharded={r: ("fsdp", MESH8_FSDP[r]) for r in range(8)},
        unsharded={r: ("dp_replicate", MESH8_REP[r]) for r in range(8)},
    )


# ================================================================== dp x tp x ep (8 ranks)

# ParallelDims(8, dp_shard=4, tp=2, ep=2, etp=2). Dense (dp_replicate 1, fsdp 4, tp 2): rank = 2*fsdp + tp.
# Sparse (dp_replicate 1, efsdp 2, ep 2, etp 2): rank = 4*efsdp + 2*ep + etp.
EP_FSDP = {
    0: [0, 2, 4, 6],
    1: [1, 3, 5, 7],
    2: [0, 2, 4, 6],
    3: [1, 3, 5, 7],
    4: [0, 2, 4, 6],
    5: [1, 3, 5, 7],
    6: [0, 2, 4, 6],
    7: [1, 3, 5, 7],
}
EP_EFSDP = {0: [0, 4], 1: [1, 5], 2: [2, 6], 3: [3, 7], 4: [0, 4], 5: [1, 5], 6: [2, 6], 7: [3, 7]}


@case("tp_block_and_experts_on_ep_etp", 8)
def dp_tp_ep(res: Result) -> None:
    """ParallelDims(8, dp_shard=4, tp=2, ep=2, etp=2) -> sparse (dp_replicate 1, efsdp 2, ep 2,
    etp 2). Dense block: torch TP on tp + fully_shard on (dp_replicate, fsdp=4); experts [4, 32, 32]:
    a DTensor (Shard(0), Shard(2)) on (ep, etp) + fully_shard on (dp_replicate, efsdp). Unshard
    gathers only the efsdp dim: ep / etp placements identical before and after. The ranks of one
    ep x etp group share data (efsdp index = data slice), so DTensor ops compute exact gradients."""
    dims = ParallelDims(world_size=8, dp_shard=4, tp=2, ep=2, etp=2)
    views = build_mesh(dims, "cpu")
    torch.manual_seed(4)
    model = DenseAndExperts()
    reference = copy.deepcopy(model)
    parallelize_module(model.block, views[MeshDim.TP], tp_plan())
    model.experts.weight = nn.Parameter(
        distribute_tensor(
            model.experts.weight.detach(),
            views.sparse[MeshDim.EP, MeshDim.ETP],
            [Shard(0), Shard(2)],
            src_data_rank=None,
        )
    )
    fully_shard(model.block, mesh=views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    fully_shard(model.experts, mesh=views.sparse[MeshDim.DP_REPLICATE, MeshDim.EFSDP])
    fully_shard(model, mesh=views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    res.facts["params"] = param_facts(model)
    coords = dims.coordinates(this_rank())
    res.facts["efsdp_index"] = coords[MeshDim.EFSDP]
    *local, gx, gy = batch(15, coords[MeshDim.EFSDP], dims.efsdp * dims.dp_replicate)
    train_side_by_side(res, {"ours": model}, reference, local, (gx, gy), [("ours", "ref", "fp32")])


def test_tp_block_and_experts_numbers_match_reference(fully_shard_run8):
    assert_numbers(fully_shard_run8.case("tp_block_and_experts_on_ep_etp"), "ours-ref")


def test_tp_block_and_experts_unshard_changes_only_the_fsdp_dim(fully_shard_run8):
    """Experts [4, 32, 32] on (ep, etp) = (Shard(0), Shard(2)), fully_shard on (dp_replicate, efsdp):
    sharded (R, S(1), S(0), S(2)) -> unsharded (R, R, S(0), S(2)); ep / etp never change. Dense
    block on fsdp=4, experts on efsdp=2: RS / AG each on its own group, no all-reduce."""
    results = fully_shard_run8.case("tp_block_and_experts_on_ep_etp")
    for rank, result in results.items():
        experts = [e for e in result["placements"] if e["param"] == "experts.weight"]
        assert len(experts) == 8  # per step: unshard + reshard in forward and in backward
        for event in experts:
            assert event["mesh_dims"] == ["dp_replicate", "efsdp", "ep", "etp"]
            before, after = split_placements(event["before"]), split_placements(event["after"])
            sharded, unsharded = (before, after) if before[1] != "R" else (after, before)
            assert sharded == ["R", "S(1)", "S(0)", "S(2)"] and unsharded == ["R", "R", "S(0)", "S(2)"], event
        for event in result["placements"]:  # every parameter: only the FSDP entry changes
            before, after = split_placements(event["before"]), split_placements(event["after"])
            changed = [i for i, (b, a) in enumerate(zip(before, after)) if b != a]
            fsdp_index = 1
            assert changed == [fsdp_index], event
        fact = result["facts"]["params"]["experts.weight"]
        assert (fact["shape"], fact["local_shape"], fact["placements"]) == (
            [4, 32, 32],
            [2, 16, 16],
            "(S(1), S(0), S(2))",  # the DTensor itself lives on the dims > 1: dp_replicate = 1 is dropped
        )
        assert (fact["shard_size"], fact["dp_size"], fact["rank_size"]) == (2, 1, 2)
        assert (fact["sharded"]["name"], fact["sharded"]["ranks"]) == ("efsdp", EP_EFSDP[rank])
        assert (fact["unsharded"]["name"], fact["unsharded"]["ranks"]) == ("dp_replicate", [rank])

    def expected(rank, step):
        g, eg = EP_FSDP[rank], EP_EFSDP[rank]
        return (
            fsdp_unit("root", "fsdp", g, ROOT_S4, root=True)
            + fsdp_unit("block", "fsdp", g, BLOCK_TP2_S4)
            + fsdp_unit("experts", "efsdp", eg, EXPERTS_S2)
        )

    assert_collectives(results, expected)


# ================================================================== gradient clipping over two meshes (8 ranks)


@case("clip_grad_norm_over_two_meshes", 8)
def clip_over_two_meshes(res: Result) -> None:
    """(dp_replicate=2, fsdp=2, tp=2) as hsdp_with_dtensor_tp: the blocks' gradients are DTensors on (dp_replicate, fsdp, tp),
    the root's on (dp_replicate, fsdp). torch's clip_grad_norm_ refuses to stack norms of two meshes;
    ours returns the single-process model's total norm and leaves the same clipped gradients (2-norm and
    inf-norm, max_norm half the total so the clipping scales)."""
    dims = ParallelDims(world_size=8, dp_replicate=2, dp_shard=2, tp=2)
    views = build_mesh(dims, "cpu")
    model = new_mlp(5)
    reference = copy.deepcopy(model)
    for block in model.blocks:
        parallelize_module(block, views[MeshDim.TP], tp_plan())
    apply_ours(model, views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    x, y, gx, gy = batch(16, dims.coordinates(this_rank())[MeshDim.DP], dims.dp)
    mse(model(x), y).backward()
    mse(reference(gx), gy).backward()
    meshes = {p.grad.device_mesh.mesh_dim_names for p in model.parameters() if isinstance(p.grad, DTensor)}
    res.facts["grad_meshes"] = sorted(list(m) for m in meshes)
    try:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        res.facts["torch_clip"] = "ran"
    except RuntimeError as error:
        res.facts["torch_clip"] = str(error).splitlines()[0]
    for norm_type in (2.0, float("inf")):
        whole = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()], norm_type)
        max_norm = whole.item() / 2
        ours = clip_grad_norm_(model.parameters(), max_norm, norm_type)
        theirs = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm, norm_type)
        label = "2" if norm_type == 2.0 else "inf"
        res.compare(f"norm_{label}:ours-ref", {"norm": ours}, {"norm": theirs})
        res.compare(
            f"clipped_{label}:ours-ref",
            full_grads(model),
            {n: p.grad for n, p in reference.named_parameters()},
        )


def test_clip_grad_norm_over_the_two_meshes_of_tp_and_fully_shard_equals_one_process(fully_shard_run8):
    """The total norm (2 and inf) and the clipped gradients equal torch's clip_grad_norm_ on the
    single-process model; torch's own clip_grad_norm_ cannot stack the two meshes' norms."""
    results = fully_shard_run8.case("clip_grad_norm_over_two_meshes")
    for rank, result in results.items():
        assert result["facts"]["grad_meshes"] == [["dp_replicate", "fsdp"], ["dp_replicate", "fsdp", "tp"]]
        assert "same mesh" in result["facts"]["torch_clip"], result["facts"]["torch_clip"]
        for label in ("norm_2", "clipped_2", "norm_inf", "clipped_inf"):
            entry = result["numbers"][f"{label}:ours-ref"]
            assert entry["ratio"] <= 1.0, (rank, label, entry["worst"], entry["max_abs"])
