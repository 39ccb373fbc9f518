"""What the tests/test_fully_shard_*.py files hold the fully_shard workers' results to, derived
independently of fully_shard: the tolerances of the comparisons with the single-process reference and
torch's FSDP2 (``assert_numbers``), the byte counts of every unit's flat buffer derived by hand from the
model's parameter shapes and the padding rule, the multisets of reduce-scatter / all-reduce / all-gather
events each rank must trace per step (``fsdp_unit``, ``hsdp_step``, ``sp_activations``, compared by
``assert_collectives``), the GroupInfo of every parameter (``assert_group_facts``) and the placement
transitions of a unit (``unit_transitions``); rank lists are written literally.
"""

from __future__ import annotations

import math
from collections import Counter

# Every case is checked twice: numbers (loss, gradients via ``p.grad.full_tensor()`` and parameters after
# each of two SGD steps equal an unparallelized deepcopy trained on the global batch; FSDP, HSDP and
# FSDP+TP also equal torch's own ``torch.distributed.fsdp.fully_shard`` trained side by side), and
# communication (the trace events of each step -- op, phase, unit, group name, global rank list, bytes,
# dtype -- equal the multiset derived by hand, rank by rank).
#
# Model: ``MLP(MLPConfig(d_in=16, d_model=32, hidden=64, d_out=6, n_blocks=2, seq_len=8))``, global
# batch 8. fully_shard units: ``blocks.0``, ``blocks.1`` and the root (``inp`` + ``head``, named "root").
# d_out=6 does not split over 4 ranks: the head is padded to 8 rows and rank 3 holds empty shards.
#
# Tolerances: fp32 ``rtol=1e-5, atol=1e-6`` (``|a-b| <= atol + rtol*|b|`` elementwise). bf16 (bf16_mixed_precision):
# ours and torch FSDP2 under the same MixedPrecisionPolicy are compared with the fp32 tolerance (they
# are in fact bit-identical: same bf16 all-gather, same fp32 reduce-scatter). Against the fp32
# reference the bound is looser and documented at ``BF16_*`` below.

FP32 = (1e-5, 1e-6)  # rtol, atol
# bf16 compute vs the fp32 reference. bf16 keeps 8 significant bits (unit roundoff 2^-9 ~ 2e-3);
# every activation, weight copy and backward matmul rounds, and gradient elements are sums with
# cancellation, so small gradient elements have no meaningful elementwise relative error (measured:
# max |diff| up to ~19% of the tensor's largest element). Bounds, measured values in brackets:
BF16_LOSS = (1e-3, 0.0)  # relative error of the loss [2.3e-4]
BF16_GRAD_REL_L2 = 0.1  # ||g - g_ref|| / ||g_ref|| per gradient tensor [0.072]
BF16_PARAM = (1e-2, 2e-3)  # params after SGD steps, elementwise (rtol, atol) [max |diff| 9e-4]
TOLERANCES = {"fp32": FP32, "bf16_torch": FP32, "bf16_ref": BF16_PARAM}

# ------------------------------------------------------------------ hand-derived sizes (fp32: 4 bytes)
# Parameters per unit (MLPConfig above). nn.Linear(i, o).weight is [o, i].
BLOCK_PARAMS = {
    "norm.weight": (32,),
    "w1.weight": (64, 32),
    "w1.bias": (64,),
    "w2.weight": (32, 64),
    "w2.bias": (32,),
}  # 4224 elements
ROOT_PARAMS = {"inp.weight": (32, 16), "inp.bias": (32,), "head.weight": (6, 32), "head.bias": (6,)}  # 742
# The same block after tensor parallelism over tp=2 (what one tp rank holds): w1 colwise Shard(0),
# w2 rowwise Shard(1), norm weight and w2 bias replicated. FSDP then shards axis 1 of w1.weight
# (axis 0 is TP's) and axis 0 of everything else (w1.bias: strided).
BLOCK_TP2_LOCAL = {
    "norm.weight": ((32,), 0),
    "w1.weight": ((32, 32), 1),
    "w1.bias": ((32,), 0),
    "w2.weight": ((32, 32), 0),
    "w2.bias": ((32,), 0),
}  # 2144 elements

# The all-gather output / reduce-scatter input of a unit: every parameter padded along its FSDP axis
# to a multiple of the shard size, times 4 bytes (the flat buffer the collective moves).
BLOCK_S4 = 16896  # 4224 * 4, every axis divisible by 4
BLOCK_S2 = 16896  # 4224 * 4
ROOT_S4 = 3232  # (512 + 32 + 8*32 + 8) * 4: head's 6 rows padded to 8
ROOT_S2 = 2968  # 742 * 4, no padding
BLOCK_TP2_S2 = 8576  # 2144 * 4 (tp-local block over fsdp=2)
BLOCK_TP2_S4 = 8576  # 2144 * 4 (tp-local block over fsdp=4: every FSDP axis divisible by 4)
EXPERTS_S2 = 4096  # experts [4, 32, 32] on (ep=2, etp=2) -> local [2, 32, 16], FSDP axis 1: 1024 * 4
# All-reduces after a reduce-scatter move this rank's shard: the full buffer / shard size.
# Without sharding (shard 1) they move the whole (tp-local) unit.
# Sequence-parallel activation collectives (local-tensor TP): [rows, seq 8, d_model 32] fp32.
# Partial-gradient all-reduce over tp: norm.weight + w2.bias of a block (32 + 32 elements) / shard.


def unit_bytes(params: dict, shard: int, itemsize: int = 4) -> int:
    """Bytes of a unit's flat all-gather buffer: each parameter padded along its FSDP axis."""
    total = 0
    for value in params.values():
        shape, axis = value if isinstance(value[0], tuple) else (value, 0)
        padded = list(shape)
        padded[axis] = math.ceil(shape[axis] / shard) * shard
        total += math.prod(padded)
    return total * itemsize


# ------------------------------------------------------------------ numbers


def assert_numbers(results: dict[int, dict], pair: str = "ours-ref", steps: int = 2, kinds=("loss", "grad", "param")):
    """Every compared tensor within its tolerance (ratio <= 1, i.e. allclose) on every rank."""
    for rank, result in results.items():
        for step in range(steps):
            for kind in kinds:
                label = f"{kind}{step}:{pair}"
                entry = result["numbers"][label]
                assert entry["ratio"] <= 1.0, (
                    f"rank {rank} {label}: {entry['worst']} differs by {entry['per'][entry['worst']]['max_abs']:.3g} "
                    f"(rtol={entry['rtol']}, atol={entry['atol']})"
                )


def ratios(result: dict, label: str) -> dict[str, float]:
    return {name: value["ratio"] for name, value in result["numbers"][label]["per"].items()}


# ------------------------------------------------------------------ communication

FWD, BWD = "forward", "backward"


def ag(phase, module, group, ranks, nbytes, dtype="float32"):
    return (phase, "all_gather", module, group, tuple(ranks), nbytes, dtype)


def rs(module, group, ranks, nbytes, dtype="float32"):
    return (BWD, "reduce_scatter", module, group, tuple(ranks), nbytes, dtype)


def ar(module, group, ranks, nbytes, dtype="float32"):
    return (BWD, "all_reduce", module, group, tuple(ranks), nbytes, dtype)


ANY = "<any unit>"  # module wildcard, used for exactly one event (see sp_activations)


def collectives(result: dict, step: int) -> Counter:
    return Counter(
        (e["phase"], e["op"], e["module"], e["group"], tuple(e["ranks"]), e["bytes"], e["dtype"])
        for e in result["collectives"]
        if e["step"] == step
    )


def _match(actual: Counter, want: Counter) -> tuple[Counter, Counter]:
    """(missing, unexpected) of two event multisets; an expected module ``ANY`` matches any module."""
    exact = Counter({k: v for k, v in want.items() if k[2] != ANY})
    missing, unexpected = exact - actual, actual - exact
    for key, count in want.items():
        if key[2] != ANY:
            continue
        for _ in range(count):
            found = next((k for k in unexpected if k[:2] + k[3:] == key[:2] + key[3:]), None)
            if found is None:
                missing[key] += 1
            else:
                unexpected[found] -= 1
                unexpected += Counter()  # drop zero counts
    return missing, unexpected


def assert_collectives(results: dict[int, dict], expected, steps=(0, 1)):
    """``expected(rank, step)`` -> list of events; compared as multisets, rank by rank, step by step."""
    for rank, result in sorted(results.items()):
        for step in steps:
            missing, unexpected = _match(collectives(result, step), Counter(expected(rank, step)))
            assert not missing and not unexpected, (
                f"rank {rank} step {step}:\n  missing    {sorted(missing.items())}\n"
                f"  unexpected {sorted(unexpected.items())}"
            )
        other = sorted({e["step"] for e in result["collectives"]} - set(steps))
        assert not other, f"rank {rank}: collectives in unexpected steps {other}"


def fsdp_unit(
    module,
    group,
    ranks,
    nbytes,
    *,
    root=False,
    ar_group=None,
    ar_ranks=None,
    ar_bytes=None,
    ag_dtype="float32",
    ag_bytes=None,
    rs_dtype="float32",
    reduce=True,
):
    """One sharded unit per step: AG in forward; AG again in backward unless it is the root (the
    root is not resharded after forward, as in FSDP2); RS (+ AR on the replicate group) in backward."""
    gathered = ag_bytes or nbytes
    events = [ag(FWD, module, group, ranks, gathered, ag_dtype)]
    if not root:
        events.append(ag(BWD, module, group, ranks, gathered, ag_dtype))
    if reduce:
        events.append(rs(module, group, ranks, nbytes, rs_dtype))
        if ar_group:
            events.append(ar(module, ar_group, ar_ranks, ar_bytes))
    return events


def hsdp_step(fsdp_ranks, replicate_ranks, block_bytes):
    """The root and both blocks under HSDP: each reduce-scatters on fsdp, then all-reduces its shard
    (half the buffer: fsdp has 2 ranks) on dp_replicate, unless ``replicate_ranks`` is None."""
    group = "dp_replicate" if replicate_ranks else None
    return [
        event
        for module, nbytes in (("root", ROOT_S2), ("blocks.0", block_bytes), ("blocks.1", block_bytes))
        for event in fsdp_unit(
            module,
            "fsdp",
            fsdp_ranks,
            nbytes,
            root=module == "root",
            ar_group=group,
            ar_ranks=replicate_ranks,
            ar_bytes=nbytes // 2,
        )
    ]


def sp_activations(ranks, nbytes, scatter_adjoint_module=ANY):
    """Local-tensor TP+SP activation collectives of one step on ("tp", ranks), each [rows, 8, 32] fp32,
    labelled with the fully_shard unit whose computation issues them. Forward: each block all-gathers
    the sequence before its colwise layer and reduce-scatters after its rowwise layer; the root
    all-gathers before the head (its input scatter is a local chunk). Backward, the adjoints: each
    block all-gathers (for its reduce-scatter) and reduce-scatters (for its partial gather); the
    head's gather is replicated (a local chunk); the root's input scatter all-gathers. That last one
    is the root's, but fully_shard labels it with the last unit whose backward began (blocks.0),
    see test_trace_labels_the_roots_backward_activation_collective_with_root in
    tests/test_fully_shard_local_tp.py."""
    events = [ag(FWD, "root", "tp", ranks, nbytes), ag(BWD, scatter_adjoint_module, "tp", ranks, nbytes)]
    for block in ("blocks.0", "blocks.1"):
        events += [
            ag(FWD, block, "tp", ranks, nbytes),
            (FWD, "reduce_scatter", block, "tp", tuple(ranks), nbytes, "float32"),
            ag(BWD, block, "tp", ranks, nbytes),
            rs(block, "tp", ranks, nbytes),
        ]
    return events


def assert_group_facts(results, params, shard_size, dp_size, rank_size, sharded, unsharded):
    """``sharded`` / ``unsharded``: rank -> (name, ranks) of that parameter's GroupInfo."""
    for rank, result in results.items():
        facts = result["facts"]["params"]
        for name in params:
            fact = facts[name]
            assert (fact["shard_size"], fact["dp_size"], fact["rank_size"]) == (shard_size, dp_size, rank_size), (
                rank,
                name,
                fact,
            )
            assert (fact["sharded"]["name"], fact["sharded"]["ranks"], fact["sharded"]["size"]) == (
                *sharded[rank],
                shard_size,
            ), (rank, name, fact["sharded"])
            assert (fact["unsharded"]["name"], fact["unsharded"]["ranks"], fact["unsharded"]["size"]) == (
                *unsharded[rank],
                dp_size,
            ), (rank, name, fact["unsharded"])


def split_placements(text: str) -> list[str]:
    """'(R, _S(0, 2), S(0))' -> ['R', '_S(0, 2)', 'S(0)']."""
    inner, parts, depth, current = text.strip()[1:-1], [], 0, ""
    for char in inner:
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        depth += char == "("
        depth -= char == ")"
        current += char
    return parts + ([current.strip()] if current.strip() else [])


def placements(result: dict, step: int) -> Counter:
    return Counter(
        (e["param"], tuple(e["mesh_dims"]), e["before"], e["after"], e["phase"])
        for e in result["placements"]
        if e["step"] == step
    )


def unit_transitions(params: dict[str, tuple], root: bool) -> Counter:
    """Placement events of one unit per step: ``params[name] = (mesh_dims, sharded, unsharded)``.
    Unshard in forward, reshard after forward (not the root), unshard again in backward, reshard
    after the reduction (the root: at the end of backward)."""
    events = Counter()
    for name, (dims, sharded, unsharded) in params.items():
        if root:
            sequence = [(sharded, unsharded, FWD), (unsharded, sharded, BWD)]
        else:
            sequence = [
                (sharded, unsharded, FWD),
                (unsharded, sharded, FWD),
                (sharded, unsharded, BWD),
                (unsharded, sharded, BWD),
            ]
        for before, after, phase in sequence:
            events[(name, tuple(dims), before, after, phase)] += 1
    return events


# ------------------------------------------------------------------ parameters and rank groups

BLOCK_NAMES = [f"blocks.{b}.{p}" for b in (0, 1) for p in BLOCK_PARAMS]
ALL_NAMES = list(ROOT_PARAMS) + BLOCK_NAMES

FSDP4 = {0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3], 3: [0, 1, 2, 3]}
HSDP_FSDP = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}  # rank = dp_replicate * 2 + fsdp
HSDP_REP = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}

# ParallelDims(8, dp_replicate=2, dp_shard=2, tp=2): rank = 4 * dp_replicate + 2 * fsdp + tp
MESH8_FSDP = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3], 4: [4, 6], 5: [5, 7], 6: [4, 6], 7: [5, 7]}
MESH8_REP = {0: [0, 4], 1: [1, 5], 2: [2, 6], 3: [3, 7], 4: [0, 4], 5: [1, 5], 6: [2, 6], 7: [3, 7]}
MESH8_TP = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3], 4: [4, 5], 5: [4, 5], 6: [6, 7], 7: [6, 7]}
