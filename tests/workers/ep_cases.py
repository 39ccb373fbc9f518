"""Worker for tests/test_ep_dispatch.py: every expert-parallel case of one world size in one process group.

For each case every rank builds the same seed-built MoE (the reference) and two parallel copies
(``parallelize_moe`` with ``dispatch="all_to_all"`` and ``dispatch="all_gather"``), feeds each copy its
own tokens (ranks with the same data coordinate hold the same tokens: tp / etp ranks; ``seq_lens``
gives the data coordinates different token counts), and compares each with the reference applied to
all distinct tokens:

* this rank's outputs and input gradients against the reference rows of its data;
* this rank's expert shards' gradients against the matching slices of the reference gradients;
* router and shared-expert gradients summed over all ranks (divided by the number of ranks that hold
  the same tokens without splitting them, i.e. etp) against the reference;
* the all-gather copy against the all-to-all copy (outputs, input and parameter gradients, local shards).

Loss = sum(outputs * fixed random weights). The collectives recorded during forward and
backward are saved per dispatch as (phase, op, group, ranks, dtype, bytes). Results go to
$HYPER_PARALLEL_RUN_DIR/ep_rank<r>.json as {case: {"all_to_all": ..., "all_gather": ..., ...}}.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import sys
import time
from pathlib import Path

STARTED = time.perf_counter()

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hyper_parallel import trace
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import build_mesh
from hyper_parallel.models.moe import MoE, MoEConfig
from hyper_parallel.parallel.ep import parallelize_moe

BATCH, SEQ, D_MODEL, HIDDEN = 2, 4, 8, 16
DISPATCHES = ("all_to_all", "all_gather")

# name -> degrees, expert mesh, token split, MoE config, experts that never win (zero tokens), tokens per
# data coordinate (seq_lens: uneven routed-row counts, padded to the max by the all-gather dispatch), check
CASES = {
    2: {
        "ep2_top1": dict(dims=dict(dp_shard=2, ep=2), top_k=1, renormalize=False),
        "ep2_top2": dict(dims=dict(dp_shard=2, ep=2), top_k=2),
        "ep2_top2_dead_expert": dict(dims=dict(dp_shard=2, ep=2), top_k=2, dead=[3]),
        "ep2_top1_idle_rank": dict(dims=dict(dp_shard=2, ep=2), top_k=1, dead=[2, 3], renormalize=False),
        "ep2_tp2_split_top2": dict(dims=dict(dp_shard=1, tp=2, ep=2), top_k=2, split=True),
        "ep2_top2_uneven_tokens": dict(dims=dict(dp_shard=2, ep=2), top_k=2, seq_lens=[4, 1]),
    },
    4: {
        "ep4_top2": dict(dims=dict(dp_shard=4, ep=4), top_k=2, num_experts=8, dead=[5]),
        "ep4_top1_no_shared": dict(dims=dict(dp_shard=4, ep=4), top_k=1, shared=False, renormalize=False),
        "ep2_etp2_top2": dict(dims=dict(dp_shard=2, tp=2, ep=2, etp=2), top_k=2),
        "ep2_etp2_top1_dead_expert": dict(
            dims=dict(dp_shard=2, tp=2, ep=2, etp=2), top_k=1, dead=[1], renormalize=False, separate_etp_mesh=True
        ),
        "ep4_tp2_split_top2": dict(dims=dict(dp_shard=2, tp=2, ep=4), top_k=2, split=True),
        # the same mesh without the split: tp ranks hold the same tokens, so expert work and expert
        # gradients are duplicated (checked: expert grads come out exactly 2x the reference)
        "ep4_tp2_nosplit_duplicates": dict(dims=dict(dp_shard=2, tp=2, ep=4), top_k=2, duplicated=2),
        # rank 2 routes no token at all (still joins every collective), the others 16, 8, 12 rows
        "ep4_top2_uneven_empty_rank": dict(dims=dict(dp_shard=4, ep=4), top_k=2, seq_lens=[4, 2, 0, 3]),
    },
}


def _max(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameter gradients by name, the local shard of DTensor ones."""
    return {name: p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for name, p in module.named_parameters()}


def run_case(name: str, spec: dict, views_cache: dict, seed: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    dims = ParallelDims(world_size=world, **spec["dims"])
    key = tuple(sorted(spec["dims"].items()))
    if key not in views_cache:
        views_cache[key] = build_mesh(dims, "cpu")
    views = views_cache[key]
    etp = dims.etp > 1
    config = MoEConfig(
        d_model=D_MODEL,
        hidden=HIDDEN,
        num_experts=spec.get("num_experts", 4),
        top_k=spec["top_k"],
        shared_expert=spec.get("shared", True),
        renormalize=spec.get("renormalize", True),
    )

    torch.manual_seed(seed)
    reference = MoE(config)
    generator = torch.Generator().manual_seed(seed + 1)
    data = torch.randn(dims.dp, BATCH, SEQ, D_MODEL, generator=generator)
    weights = torch.randn(dims.dp, BATCH, SEQ, D_MODEL, generator=generator)
    seq_lens = spec.get("seq_lens", [SEQ] * dims.dp)  # tokens of data coordinate i: data[i][:, :seq_lens[i]]
    dead = spec.get("dead", [])
    if dead:  # feature 0 is >= 3 for every token and the dead experts' logits are -50 * feature 0
        data[..., 0] = 3.0 + data[..., 0].abs()
        with torch.no_grad():
            reference.router.gate.weight[dead] = 0.0
            reference.router.gate.weight[dead, 0] = -50.0
    copies = {dispatch: copy.deepcopy(reference) for dispatch in DISPATCHES}  # before any backward
    split = views[MeshDim.TP] if spec.get("split") else None
    for dispatch, parallel in copies.items():
        if spec.get("separate_etp_mesh"):
            parallelize_moe(parallel, views[MeshDim.EP], views[MeshDim.ETP], token_split_mesh=split, dispatch=dispatch)
        else:
            parallelize_moe(
                parallel,
                views[MeshDim.EP, MeshDim.ETP] if etp else views[MeshDim.EP],
                token_split_mesh=split,
                dispatch=dispatch,
            )

    # reference: all distinct tokens in one process (the MoE is token-wise: one [1, T, d] sequence)
    x_all = torch.cat([data[i][:, :n].reshape(-1, D_MODEL) for i, n in enumerate(seq_lens)])
    x_all = x_all.unsqueeze(0).requires_grad_(True)
    ref_out = reference(x_all)
    with torch.no_grad():
        _, chosen = reference.router(x_all.reshape(-1, D_MODEL))
        tokens_per_expert = torch.bincount(chosen.reshape(-1), minlength=config.num_experts).tolist()
    loss_weights = torch.cat([weights[i][:, :n].reshape(-1, D_MODEL) for i, n in enumerate(seq_lens)])
    (ref_out[0] * loss_weights).sum().backward()
    sizes = [BATCH * n for n in seq_lens]
    ref_outs = [o.reshape(BATCH, n, D_MODEL) for o, n in zip(ref_out.detach()[0].split(sizes), seq_lens)]
    ref_x_grads = [g.reshape(BATCH, n, D_MODEL) for g, n in zip(x_all.grad[0].split(sizes), seq_lens)]
    ref_grads = dict(reference.named_parameters())

    index = dims.coordinates(rank)[MeshDim.DP]  # ranks with the same data index hold the same tokens
    results, seen = {}, {}
    for dispatch, parallel in copies.items():
        x = data[index][:, : seq_lens[index]].clone().requires_grad_(True)
        started = time.perf_counter()
        with trace.record() as recorder:
            with trace.labels(phase="forward"):
                out = parallel(x)
            with trace.labels(phase="backward"):
                (out * weights[index][:, : seq_lens[index]]).sum().backward()
        elapsed = time.perf_counter() - started
        errors = {"output": _max(out.detach(), ref_outs[index]), "input_grad": _max(x.grad, ref_x_grads[index])}
        # expert shards: Shard(0) on ep, with ETP Shard(2) (w1) / Shard(1) (w2) on etp
        experts = parallel.experts
        local = config.num_experts // experts.ep.size
        first = experts.ep.ranks.index(rank) * local
        w1_ref, w2_ref = (
            reference.experts.w1.grad[first : first + local],
            reference.experts.w2.grad[first : first + local],
        )
        if etp:
            h = HIDDEN // experts.etp.size
            j = experts.etp.ranks.index(rank)
            w1_ref, w2_ref = w1_ref[:, :, j * h : (j + 1) * h], w2_ref[:, j * h : (j + 1) * h, :]
        scale = spec.get("duplicated", 1)
        w1_grad, w2_grad = experts.w1.grad.to_local(), experts.w2.grad.to_local()
        assert tuple(w1_grad.shape) == tuple(w1_ref.shape) and tuple(w2_grad.shape) == tuple(w2_ref.shape)
        errors["experts.w1"] = _max(w1_grad, scale * w1_ref)
        errors["experts.w2"] = _max(w2_grad, scale * w2_ref)
        # replicated parameters: sum over ranks; etp ranks hold (and fully compute) the same tokens
        replicas = dims.etp if etp else spec.get("duplicated", 1)
        for pname, param in parallel.named_parameters():
            if pname.startswith("experts."):
                continue
            summed = param.grad.clone()
            dist.all_reduce(summed)
            errors[pname] = _max(summed / replicas, ref_grads[pname].grad)
        events = [
            [e["phase"], e["op"], e["group"], e["ranks"], e["dtype"], e["bytes"]]
            for e in recorder.events
            if e["kind"] == "collective"
        ]
        seen[dispatch] = {"output": out.detach(), "input_grad": x.grad, **_grads(parallel)}
        results[dispatch] = {
            "errors": errors,
            "events": events,
            "seconds": elapsed,
            "tokens_per_expert": tokens_per_expert,
            "unscaled_expert_w1_error": _max(w1_grad, w1_ref),
            "ep_ranks": list(experts.ep.ranks),
            "etp_ranks": list(experts.etp.ranks) if etp else None,
            "local_shapes": {"w1": list(w1_grad.shape), "w2": list(w2_grad.shape)},
            "expert_ref_grad_max": max(w1_ref.abs().max().item(), w2_ref.abs().max().item()),
            "parameters": {
                pname: [type(param).__name__, list(param.shape), [str(p) for p in getattr(param, "placements", ())]]
                for pname, param in parallel.named_parameters()
            },
            "experts_class": type(experts).__name__,
        }
    a2a, ag = seen["all_to_all"], seen["all_gather"]
    results["all_gather_vs_all_to_all"] = {key: _max(ag[key], a2a[key]) if key in ag else float("inf") for key in a2a}
    return results


def _raises(fn) -> str:
    try:
        fn()
    except ValueError as error:
        return str(error)
    return "no error"


def check_errors(views_cache: dict) -> dict:
    """Invalid uses raise ValueError on every rank before any collective (so nothing hangs)."""
    world = dist.get_world_size()
    small = dict(d_model=D_MODEL, hidden=HIDDEN, num_experts=4, top_k=2)
    messages = {}
    if world == 2:
        views = views_cache[(("dp_shard", 2), ("ep", 2))]
        messages["experts_not_divisible"] = _raises(
            lambda: parallelize_moe(MoE(MoEConfig(**dict(small, num_experts=3))), views[MeshDim.EP])
        )
        messages["wrong_mesh"] = _raises(lambda: parallelize_moe(MoE(MoEConfig(**small)), views[MeshDim.DP_SHARD]))
        messages["unknown_dispatch"] = _raises(
            lambda: parallelize_moe(MoE(MoEConfig(**small)), views[MeshDim.EP], dispatch="alltoall")
        )
        twice = parallelize_moe(MoE(MoEConfig(**small)), views[MeshDim.EP])
        messages["twice"] = _raises(lambda: parallelize_moe(twice, views[MeshDim.EP]))
        views = views_cache[(("dp_shard", 1), ("ep", 2), ("tp", 2))]
        odd_seq = parallelize_moe(MoE(MoEConfig(**small)), views[MeshDim.EP], token_split_mesh=views[MeshDim.TP])
        messages["seq_not_divisible"] = _raises(lambda: odd_seq(torch.randn(1, 3, D_MODEL)))
    else:
        views = views_cache[(("dp_shard", 2), ("ep", 2), ("etp", 2), ("tp", 2))]
        messages["hidden_not_divisible"] = _raises(
            lambda: parallelize_moe(MoE(MoEConfig(**dict(small, hidden=15))), views[MeshDim.EP, MeshDim.ETP])
        )
        messages["split_with_etp"] = _raises(
            lambda: parallelize_moe(
                MoE(MoEConfig(**small)), views[MeshDim.EP, MeshDim.ETP], token_split_mesh=views[MeshDim.TP]
            )
        )
    return messages


def main() -> int:
    imported = time.perf_counter() - STARTED
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        print(
            f"rank {rank}: imports {imported:.1f} s, process group {time.perf_counter() - STARTED - imported:.1f} s",
            flush=True,
        )
        only = sys.argv[1:]
        results, views_cache = {}, {}
        for seed, (name, spec) in enumerate(CASES[world].items()):
            if only and name not in only:
                continue
            results[name] = run_case(name, spec, views_cache, seed)
            for dispatch in DISPATCHES:
                result = results[name][dispatch]
                worst = max(result["errors"].values())
                print(
                    f"rank {rank} {name} {dispatch}: max error {worst:.3g} ({result['seconds'] * 1e3:.1f} ms)",
                    flush=True,
                )
            print(
                f"rank {rank} {name}: all_gather vs all_to_all "
                f"{max(results[name]['all_gather_vs_all_to_all'].values()):.3g}",
                flush=True,
            )
        if not only:
            results["invalid_uses"] = check_errors(views_cache)
        out = Path(os.environ.get("HYPER_PARALLEL_RUN_DIR", "."))
        (out / f"ep_rank{rank}.json").write_text(json.dumps(results))
        print(f"rank {rank}: all cases done {time.perf_counter() - STARTED:.1f} s after start", flush=True)
    finally:
        dist.destroy_process_group()
    print(f"rank {rank}: process group destroyed {time.perf_counter() - STARTED:.1f} s after start", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
