"""Synthetic trace events shared by the figure tests (tests/test_viz_*.py): collective and placement
records as the workers write them, a 4-rank HSDP run written out by hand with its fully_shard units, and
the lookup of a figure's axes by label.
"""

from __future__ import annotations

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim


def axes_labelled(fig, label):
    return next(ax for ax in fig.axes if ax.get_label() == label)


def collective_event(op, group, ranks, nbytes, phase, module, step, t0, t1):
    return {
        "kind": "collective",
        "op": op,
        "group": group,
        "ranks": ranks,
        "bytes": nbytes,
        "dtype": "float32",
        "phase": phase,
        "module": module,
        "step": step,
        "t_start": t0,
        "t_end": t1,
    }


def placement_event(param, before, after, shape, phase, step, t, mesh_dims=(MeshDim.FSDP, MeshDim.TP)):
    return {
        "kind": "placement",
        "param": param,
        "mesh_dims": list(mesh_dims),
        "before": before,
        "after": after,
        "local_shape": [1],
        "global_shape": list(shape),
        "phase": phase,
        "step": step,
        "t": t,
    }


def hsdp_traces(offset=0.0):
    """4 ranks, HSDP (dp_replicate=2 x fsdp=2), two steps of: AG a, AG root (fwd), AG a, RS a, AR a,
    RS root, AR root (bwd); rank 1's clock runs ``offset`` seconds ahead."""
    dims = ParallelDims(world_size=4, dp_replicate=2, dp_shard=2)
    traces = {}
    for rank in range(4):
        fsdp, rep = dims.group_of(MeshDim.FSDP, rank), dims.group_of(MeshDim.DP_REPLICATE, rank)
        shift = offset if rank == 1 else 0.0
        events = [collective_event("broadcast", MeshDim.FSDP, fsdp, 64, "init", "", 0, 0.0 + shift, 0.01 + shift)]
        for step in range(2):
            t = 1.0 * step + 0.1 + shift
            plan = [
                ("all_gather", MeshDim.FSDP, fsdp, 2000, "forward", "a"),
                ("all_gather", MeshDim.FSDP, fsdp, 400, "forward", "root"),
                ("all_gather", MeshDim.FSDP, fsdp, 2000, "backward", "a"),
                ("reduce_scatter", MeshDim.FSDP, fsdp, 2000, "backward", "a"),
                ("all_reduce", MeshDim.DP_REPLICATE, rep, 1000, "backward", "a"),
                ("reduce_scatter", MeshDim.FSDP, fsdp, 400, "backward", "root"),
                ("all_reduce", MeshDim.DP_REPLICATE, rep, 200, "backward", "root"),
            ]
            for i, (op, group, ranks, nbytes, phase, module) in enumerate(plan):
                events.append(
                    collective_event(op, group, ranks, nbytes, phase, module, step, t + 0.05 * i, t + 0.05 * i + 0.02)
                )
            events.append(
                placement_event(
                    "p", "(R, S(0))", "(R, R)", (4,), "forward", step, t + 0.3, (MeshDim.DP_REPLICATE, MeshDim.FSDP)
                )
            )
        traces[rank] = events
    return dims, traces


HSDP_UNITS = [
    {
        "unit": "a",
        "model_local_bytes": 2000,
        "shard_size": 2,
        "dp_size": 2,
        "reshard_after_forward": True,
        "sharded_group": {"name": MeshDim.FSDP, "ranks": [0, 1]},
        "unsharded_group": {"name": MeshDim.DP_REPLICATE, "ranks": [0, 2]},
    },
    {
        "unit": "root",
        "model_local_bytes": 400,
        "shard_size": 2,
        "dp_size": 2,
        "reshard_after_forward": False,
        "sharded_group": {"name": MeshDim.FSDP, "ranks": [0, 1]},
        "unsharded_group": {"name": MeshDim.DP_REPLICATE, "ranks": [0, 2]},
    },
]
"""The fully_shard units of the run of ``hsdp_traces`` as metrics.json lists them."""
