"""``parallelize_moe``: apply expert (and expert tensor) parallelism to a MoE layer, choosing how tokens
reach the experts: ``all_to_all`` (``ep.all_to_all``, the default) or ``all_gather`` (``ep.all_gather``).

The two implementations know nothing of each other; this module picks one.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh

from hyper_parallel.comm import GroupInfo
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.models.moe import GroupedExperts, MoE
from hyper_parallel.parallel.autograd_comm import AllGatherWithSplitBackward, SplitWithAllGatherBackward
from hyper_parallel.parallel.ep.all_gather import AllGatherExpertParallelExperts
from hyper_parallel.parallel.ep.all_to_all import SEQ_DIM, ExpertParallelExperts
from hyper_parallel.partial_grad import mark_partial


def _expert_mesh(mesh: DeviceMesh, etp_mesh: DeviceMesh | None) -> DeviceMesh:
    if etp_mesh is not None:
        if mesh.ndim != 1 or etp_mesh.ndim != 1:
            raise ValueError(
                f"with a separate etp_mesh both meshes must be 1-D; got {mesh.mesh_dim_names} "
                f"and {etp_mesh.mesh_dim_names}"
            )
        mesh = DeviceMesh._concatenate([mesh, etp_mesh])
    names = tuple(mesh.mesh_dim_names or ())
    if names not in ((MeshDim.EP,), (MeshDim.EP, MeshDim.ETP)):
        raise ValueError(
            f"parallelize_moe needs a mesh with dims ('ep',) or ('ep', 'etp') (e.g. views['ep'] or "
            f"views['ep', 'etp']); got {names or 'an unnamed mesh'}"
        )
    return mesh


def parallelize_moe(
    moe: MoE,
    mesh: DeviceMesh,
    etp_mesh: DeviceMesh | None = None,
    *,
    token_split_mesh: DeviceMesh | None = None,
    dispatch: str = "all_to_all",
) -> MoE:
    """Expert-parallelise ``moe`` in place and return it.

    ``mesh``: ``views["ep"]`` or ``views["ep", "etp"]`` (or ``views["ep"]`` plus ``etp_mesh=views["etp"]``).
    ``token_split_mesh``: a 1-D mesh whose ranks hold the same tokens inside the ep group (``views["tp"]``
    when etp == 1 and tp > 1 without sequence parallelism); only with etp == 1.
    ``dispatch``: how tokens reach the experts, ``"all_to_all"`` or ``"all_gather"`` (module docstring);
    both give the same parameters and, up to float reordering, the same outputs and gradients.
    Raises ``ValueError`` when num_experts % ep or hidden % etp is not 0, or for an unknown dispatch.
    """
    if not isinstance(moe, MoE):
        raise TypeError(f"parallelize_moe expects a hyper_parallel.models.moe.MoE, got {type(moe).__name__}")
    if not isinstance(moe.experts, GroupedExperts):
        raise ValueError(
            f"moe.experts must be a GroupedExperts, got {type(moe.experts).__name__}: "
            "was parallelize_moe already applied to this MoE?"
        )
    if dispatch not in EXPERTS_BY_DISPATCH:
        raise ValueError(f"unknown dispatch={dispatch!r}; choose one of {', '.join(map(repr, EXPERTS_BY_DISPATCH))}")
    mesh = _expert_mesh(mesh, etp_mesh)
    ep = GroupInfo.from_mesh(mesh, (MeshDim.EP,))
    etp = GroupInfo.from_mesh(mesh, (MeshDim.ETP,)) if mesh.ndim == 2 else None
    config = moe.config
    if config.num_experts % ep.size:
        raise ValueError(
            f"num_experts={config.num_experts} must be divisible by ep={ep.size} "
            "(each EP rank holds num_experts/ep experts)"
        )
    if etp is not None and config.hidden % etp.size:
        raise ValueError(
            f"the expert hidden size {config.hidden} must be divisible by etp={etp.size} "
            "(ETP splits each expert's hidden dim)"
        )
    moe.experts = EXPERTS_BY_DISPATCH[dispatch](moe.experts, mesh, ep, etp)
    if token_split_mesh is not None:
        _split_tokens(moe, token_split_mesh, etp)
    return moe


EXPERTS_BY_DISPATCH: dict[str, type[ExpertParallelExperts]] = {
    "all_to_all": ExpertParallelExperts,
    "all_gather": AllGatherExpertParallelExperts,
}


def _split_tokens(moe: MoE, split_mesh: DeviceMesh, etp: GroupInfo | None) -> None:
    if split_mesh.ndim != 1 or not split_mesh.mesh_dim_names:
        raise ValueError(f"token_split_mesh must be a named 1-D mesh (e.g. views['tp']), got {split_mesh}")
    if etp is not None and etp.size > 1:
        raise ValueError(
            "token_split_mesh is for etp == 1: with ETP every rank of an etp group must hold the same tokens"
        )
    name = split_mesh.mesh_dim_names[0]
    split = GroupInfo.from_mesh(split_mesh, (name,))
    if split.size == 1:
        return

    def scatter(module, args):
        x, *rest = args
        if x.shape[SEQ_DIM] % split.size:
            raise ValueError(
                f"seq_len={x.shape[SEQ_DIM]} must be divisible by the token-split group "
                f"{name}={split.size} (each of its ranks routes 1/{split.size} of the sequence)"
            )
        return (SplitWithAllGatherBackward.apply(x, SEQ_DIM, split), *rest)

    def gather(module, args, output):
        return AllGatherWithSplitBackward.apply(output, SEQ_DIM, split)

    moe.token_split = split
    moe._token_split_hooks = (moe.register_forward_pre_hook(scatter), moe.register_forward_hook(gather))
    replicated = [moe.router] + ([moe.shared] if moe.shared is not None else [])
    for module in replicated:
        for param in module.parameters():
            mark_partial(param, name)
