"""Communication of one training step on one rank, per collective: op, group, phase and bytes.

``bytes`` follows the trace convention (docs/design.md §5): the full, unsharded buffer of the collective
(the all-gather output, the reduce-scatter input, the all-reduce tensor, the all-to-all input).
Notation: a = compute (activation) bytes per element, r = reduce bytes, B = global_batch / dp rows
per rank, s = seq_len / (cp * ulysses) tokens per row in attention, X = B * s * d_model * a (one hidden state of
this rank's sequence chunk), L layers of which L_moe are MoE and L_dense dense.

FSDP, per unit with gathered buffer G elements (``units.Unit``), shard size S, replicas D:
    S > 1    all_gather G*a on the shard group in forward, again in backward unless the unit is the root
             (it keeps its parameters); one reduce_scatter G*r in backward
    D > 1    all_reduce G*r / S on the replicate group (HSDP; DDP / pure-TP compat when S == 1)
    tp > 1   all_reduce over tp of the unit's partial parameters' shards (SP norm weights; router and
             shared expert with etp == 1): sum(padded numel / S) * r, once per unit that has any
    float8   the all-gathers move 1 B per element (torchao's float8 all-gather of the linears' weights)
    pipeline the stack's ``pp_grad_reduce`` "once" (torch.distributed.pipelining): one reduce-scatter per
             step after the last microbatch and the all-gathers of ``fsdp_collectives``; "per_round" (Llama 3)
             all-gathers and reduce-scatters once per round of the schedule (``pipeline.rounds``) as a
             step of that many micro-batches
ZeRO-1/2 (``ModelConfig.zero`` < 3; parameters replicated over S): reduce_scatter G*r once per step
    (ZeRO-1) or per micro-batch (ZeRO-2), and one all_gather G*a of the updated parameters after the
    optimizer step (phase "step"); D > 1 as FSDP
TP with SP (each over tp, V = vocab):
    forward  all_gather (2 L_dense + L_moe + L_moe[etp>1] + 1) * X + B * s * V * a (the logits);
             reduce_scatter (2 L_dense + L_moe + 1) * X
    backward all_gather (2 L_dense + L_moe + L_moe[etp>1] + 1) * X; reduce_scatter (2 L_dense + L_moe + 1) * X
TP without SP: forward all_reduce (2 L + 1) * X and all_gather B * s * V * a; backward all_reduce
    (2 L + 1) * X: one per block input (attention, feed-forward: ``PrepareModuleInput`` sums the
    colwise layers' partial input gradients first) and one for the head input
Sequence schemes over cp, per layer, with Q = B * s * (n_heads / tp) * head_dim * a (this rank's queries)
and K = B * s * kv_heads_per_tp_rank * head_dim * a (its keys; values the same):
    all_gather  forward one all_gather of the stacked K/V, 2 K * cp (the whole sequence's K and V);
                backward one reduce_scatter of the same size, and one all_gather of the K/V again when the
                stack keeps only its own (``Stack.cp_kv_saved`` "local")
    ring        forward: cp - 1 sends of this rank's stacked K/V block in hand to the next rank, 2 K each,
                and as many receives; backward retraces the ring: cp - 2 K/V blocks (the owner's own is
                kept) and cp - 1 dK/dV blocks (2 K at float32 or wider: the gradients accumulate in
                float32), each sent to the previous rank and received from the next
    ulysses     forward one all_to_all of stacked q/k/v, Q + 2 K (GQA: two, Q and 2 K), and one of the
                attention output, Q; backward the same all_to_alls in reverse
    ulysses dim (2-D: ulysses x cp) the Ulysses all-to-alls above on the ulysses group, then the cp scheme
                on the heads it left (the same K: ulysses times the tokens, 1/ulysses of the heads)
EP, per MoE layer with T tokens per rank entering the MoE (B * s / tp under SP with etp == 1, else B * s)
and Y = T * top_k * d_model * a routed rows:
    all_to_all dispatch: forward E * 8 (int64 counts) + Y (dispatch) + Y (combine), backward 2 Y; with
                         node-limited routing (DeepSeek-V3: at most M nodes per token) min(top_k, M) copies
                         of each token cross nodes, and float8 dispatches at 1 B
    all_gather dispatch: forward all_gather ep * E * 8 + ep * Y, reduce_scatter ep * Y; backward
                         all_gather ep * Y, reduce_scatter ep * Y
    ETP (etp > 1): all_reduce Y over etp in forward and in backward
The rows a rank receives (combine input, dispatch gradient, ETP all-reduces) depend on the routing;
the model gives the balanced value, which is exactly their average over all ranks (every routed row is
received once).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

from hyper_parallel.cost_model import pipeline
from hyper_parallel.cost_model.model_configs import INT64_BYTES, ModelConfig
from hyper_parallel.cost_model.stacks import get_stack
from hyper_parallel.cost_model.units import Unit
from hyper_parallel.link import wire_factor
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.recipes.workload_facts import SequenceScheme

FLOAT8_BYTES = 1
"""torchao's float8 all-gather of the linears' weights (torchtitan's enable_fsdp_float8_all_gather)."""


@dataclass(frozen=True)
class Collective:
    op: str  # all_gather, reduce_scatter, all_reduce, all_to_all
    group: str  # trace group name: fsdp, dp_replicate, dp_replicate+fsdp, tp, cp, ep, etp, efsdp
    phase: str  # forward, backward
    bytes: float  # sum of the full buffers of ``count`` calls
    count: int
    group_size: int


def fsdp_collectives(
    gather_bytes: float,
    reduce_bytes: float,
    shard_size: int,
    dp_size: int,
    reshard_after_forward: bool,
    sharded_group: str,
    unsharded_group: str,
    micro_batches: int = 1,
    reduce_once: bool = False,
    warmup: int = 1,
) -> list[Collective]:
    """One fully_shard unit's collectives in one step (module docstring, "FSDP"); ``gather_bytes`` and
    ``reduce_bytes`` are its all-gather buffer and reduce-scatter input (S times one rank's shard).
    With ``micro_batches`` m > 1 (gradient accumulation) the all-gathers and the reduce-scatter run per
    micro-batch (gradients stay sharded), the replicate all-reduce once (FSDP2's set_requires_all_reduce).
    ``reduce_once`` (a pipeline stage, torch.distributed.pipelining's FSDP handling): the reduce-scatter
    runs once after the last microbatch and a backward does not reshard (``set_reshard_after_backward``).
    Without reshard_after_forward the parameters are all-gathered once per step. With it, of the
    schedule's order (``warmup`` forwards before the first backward: GPipe m, 1F1B min(m, pp - r)), every
    warm-up forward all-gathers; afterwards a forward finds the parameters gathered by the backward before
    it and reshards them, so each backward that follows a forward all-gathers: m - warmup + 1 of them
    (traced on recipe P1: tests/test_pipeline_costing.py)."""
    result, m = [], micro_batches
    if shard_size > 1:
        if reduce_once:
            forward, backward = (warmup, m - warmup + 1) if reshard_after_forward else (1, 0)
        else:
            forward, backward = m, m if reshard_after_forward else 0
        result.append(Collective("all_gather", sharded_group, "forward", gather_bytes * forward, forward, shard_size))
        if backward:
            result.append(
                Collective("all_gather", sharded_group, "backward", gather_bytes * backward, backward, shard_size)
            )
        r = 1 if reduce_once else m
        result.append(Collective("reduce_scatter", sharded_group, "backward", reduce_bytes * r, r, shard_size))
    if dp_size > 1:
        result.append(Collective("all_reduce", unsharded_group, "backward", reduce_bytes / shard_size, 1, dp_size))
    return result


def zero_collectives(
    gather_bytes: float,
    reduce_bytes: float,
    shard_size: int,
    dp_size: int,
    zero: int,
    sharded_group: str,
    unsharded_group: str,
    micro_batches: int = 1,
) -> list[Collective]:
    """One unit's collectives under ZeRO-1 or -2 (module docstring, "ZeRO-1/2"): the gradients reduce-
    scattered once per step (ZeRO-1: after the last micro-batch) or after every micro-batch (ZeRO-2), the
    updated parameters all-gathered once after the optimizer step (phase "step"); replicas all-reduce."""
    result = []
    if shard_size > 1:
        r = micro_batches if zero == 2 else 1
        result.append(Collective("reduce_scatter", sharded_group, "backward", reduce_bytes * r, r, shard_size))
        result.append(Collective("all_gather", sharded_group, "step", gather_bytes, 1, shard_size))
    if dp_size > 1:
        result.append(Collective("all_reduce", unsharded_group, "backward", reduce_bytes / shard_size, 1, dp_size))
    return result


def _unit_collectives(unit: Unit, config: ModelConfig, dims: ParallelDims, warmup: int = 1) -> list[Collective]:
    precision = config.precision
    gather = unit.gathered_numel * (FLOAT8_BYTES if config.float8 else precision.compute)
    sizes = (gather, unit.gathered_numel * precision.reduce, unit.shard_size, unit.dp_size)
    groups = (unit.sharded_group, unit.unsharded_group)
    m = config.accumulation(dims)[1]
    if config.zero < 3:
        result = zero_collectives(*sizes, config.zero, *groups, m)
    else:
        handling = get_stack(config.stack).pp_grad_reduce if dims.pp > 1 else ""
        rounds = pipeline.rounds(dims.pp, m) if handling == "per_round" else m
        reshard = unit.reshard_after_forward
        result = fsdp_collectives(*sizes, reshard, *groups, rounds, reduce_once=handling == "once", warmup=warmup)
        if get_stack(config.stack).zero3_calls == "module":
            result = [_per_module_calls(c, unit) for c in result]
    partial = unit.partial_numel()
    if dims.tp > 1 and partial:
        result.append(Collective("all_reduce", "tp", "backward", partial * precision.reduce, 1, dims.tp))
    return result


FUSED_QKV = {"attention.wq": "attention.wqkv", "attention.wk": "attention.wqkv", "attention.wv": "attention.wqkv"}


def _per_module_calls(collective: Collective, unit: Unit) -> Collective:
    """A unit's ZeRO-3 collective issued as DeepSpeed of 2021 did (``Stack.zero3_calls`` "module"): an
    all-gather per module holding parameters, a reduce-scatter per parameter, for the same bytes."""
    if collective.group != unit.sharded_group or collective.op not in ("all_gather", "reduce_scatter"):
        return collective
    names = set()
    for param in unit.params:
        module, _, kind = param.name.rpartition(".")
        module = FUSED_QKV.get(module, module)
        names.add(module if collective.op == "all_gather" else f"{module}.{kind}")
    calls = collective.count * len(names)
    return dataclasses.replace(collective, count=calls)


def _units_collectives(units: list[Unit], config: ModelConfig, dims: ParallelDims, warmup: int) -> list[Collective]:
    """Every unit's collectives: units alike (the layers of a kind share their parameters) are costed once
    and counted (a --compare costs thousands of layouts)."""
    alike: dict[tuple, list] = {}
    for unit in units:
        key = (
            id(unit.params),
            unit.shard_size,
            unit.dp_size,
            unit.sharded_group,
            unit.unsharded_group,
            unit.is_root,
            unit.reshard,
        )
        alike.setdefault(key, [unit, 0])[1] += 1
    result = []
    for unit, count in alike.values():
        for c in _unit_collectives(unit, config, dims, warmup):
            result.append(
                c if count == 1 else Collective(c.op, c.group, c.phase, c.bytes * count, c.count * count, c.group_size)
            )
    return result


def _tensor_parallel(
    config: ModelConfig, dims: ParallelDims, hidden: float, logits: float, embedding: bool = True, head: bool = True
) -> list[Collective]:
    """TP's activation collectives (module docstring); with ``config.loss_parallel`` the logits stay
    sharded: no logits all-gather, three forward all-reduces of one float32 per token (logits / V / a * 4
    bytes each: the row max, the sum of exponentials, the target's logit). A pipeline stage without the
    ``embedding`` has no embedding-output collective, one without the ``head`` no head-input or logits one."""
    tp, moe = dims.tp, len(config.moe_layers)
    dense = config.n_layers - moe
    loss = (
        [
            Collective(
                "all_reduce", "tp", "forward", 3 * logits / config.vocab_size / config.precision.compute * 4, 3, tp
            )
        ]
        if config.loss_parallel and head
        else []
    )
    logit_gathers, logits = (0, 0.0) if config.loss_parallel or not head else (1, logits)
    if config.uses_sequence_parallel(dims):
        gathers = 2 * dense + moe + (moe if dims.etp > 1 else 0) + int(head)
        scatters = 2 * dense + moe + int(embedding)
        return loss + [
            Collective("all_gather", "tp", "forward", gathers * hidden + logits, gathers + logit_gathers, tp),
            Collective("reduce_scatter", "tp", "forward", scatters * hidden, scatters, tp),
            Collective("all_gather", "tp", "backward", gathers * hidden, gathers, tp),
            Collective("reduce_scatter", "tp", "backward", scatters * hidden, scatters, tp),
        ]
    reduces = 2 * config.n_layers + 1
    return loss + [
        Collective("all_reduce", "tp", "forward", (2 * config.n_layers + 1) * hidden, 2 * config.n_layers + 1, tp),
        *([Collective("all_gather", "tp", "forward", logits, 1, tp)] if logit_gathers else []),
        Collective("all_reduce", "tp", "backward", reduces * hidden, reduces, tp),
    ]


def _expert_parallel(config: ModelConfig, dims: ParallelDims, rows: int, seq: int) -> list[Collective]:
    ep, etp = dims.ep, dims.etp
    layers = sum(1 for layer in range(config.total_layers) if config.is_moe_layer(layer))
    a = config.precision.compute
    tokens = rows * seq // (dims.tp if dims.etp == 1 and config.uses_sequence_parallel(dims) else 1)
    routed = tokens * config.top_k * config.d_model * a
    counts = config.num_experts * INT64_BYTES
    result = []
    if ep > 1 and config.dispatch == "all_to_all":
        # node-limited routing sends a token once per target node (forwarded inside it over NVLink, which
        # overlaps): min(top_k, limit) copies; float8 dispatches at 1 B (DeepSeek-V3 sections 3.2.2, 3.3.3)
        copies = min(config.top_k, config.ep_node_limit) if config.ep_node_limit else config.top_k
        sent = tokens * copies * config.d_model
        dispatch = sent * (FLOAT8_BYTES if config.float8 else a)
        result += [
            Collective("all_to_all", "ep", "forward", layers * (counts + dispatch + sent * a), 3 * layers, ep),
            Collective("all_to_all", "ep", "backward", layers * 2 * sent * a, 2 * layers, ep),
        ]
    elif ep > 1:
        result += [
            Collective("all_gather", "ep", "forward", layers * ep * (counts + routed), 2 * layers, ep),
            Collective("reduce_scatter", "ep", "forward", layers * ep * routed, layers, ep),
            Collective("all_gather", "ep", "backward", layers * ep * routed, layers, ep),
            Collective("reduce_scatter", "ep", "backward", layers * ep * routed, layers, ep),
        ]
    if etp > 1:
        result += [
            Collective("all_reduce", "etp", phase, layers * routed, layers, etp) for phase in ("forward", "backward")
        ]
    return result


def step_collectives(
    config: ModelConfig,
    dims: ParallelDims,
    units: list[Unit],
    embedding: bool = True,
    head: bool = True,
    warmup: int = 1,
) -> list[Collective]:
    """Every collective one rank issues in one training step (module docstring), one entry per
    (op, group, phase) with the calls' bytes summed; a pipeline stage passes its own layers as ``config``
    (``stages.stage_view``), whether it holds the ``embedding`` and the ``head``, and its schedule's
    ``warmup`` forwards (``fsdp_collectives``)."""
    return merged(_fsdp_and_activation_collectives(config, dims, units, embedding, head, warmup))


def merged(collectives: list[Collective]) -> list[Collective]:
    """One entry per (op, group, phase), in order of first appearance: bytes and counts summed."""
    result: dict[tuple[str, str, str], Collective] = {}
    for c in collectives:
        key = (c.op, c.group, c.phase)
        seen = result.get(key)
        result[key] = (
            c
            if seen is None
            else Collective(c.op, c.group, c.phase, seen.bytes + c.bytes, seen.count + c.count, c.group_size)
        )
    return list(result.values())


def _fsdp_and_activation_collectives(
    config: ModelConfig, dims: ParallelDims, units: list[Unit], embedding: bool, head: bool, warmup: int
) -> list[Collective]:
    result = _units_collectives(units, config, dims, warmup)
    if config.architecture == "mlp":
        return result
    a = config.precision.compute
    rows, seq = config.global_batch // dims.dp, config.seq_len // (dims.cp * dims.ulysses)
    if dims.tp > 1:
        hidden, logits = rows * seq * config.d_model * a, rows * seq * config.vocab_size * a
        result += _tensor_parallel(config, dims, hidden, logits, embedding, head)
    if dims.cp > 1 or dims.ulysses > 1:
        result += sequence_collectives(config, dims, rows)
    if config.is_moe:
        result += _expert_parallel(config, dims, rows, seq)
    return result


def p2p_collectives(config: ModelConfig, dims: ParallelDims, pp_rank: int) -> list[Collective]:
    """The pipeline's sends and receives of one step on pp rank ``pp_rank`` (group "pp", the trace's op
    names): one microbatch's hidden states per boundary crossed, forward, and their gradient, backward;
    sequence-sharded by cp, and by tp when sequence parallelism is used (``pipeline.plan_lines``)."""
    rows, microbatches = config.accumulation(dims)
    message = pipeline.boundary_bytes(
        rows,
        config.seq_len // dims.cp // (dims.tp if config.uses_sequence_parallel(dims) else 1),
        config.d_model,
        config.precision.compute,
    )
    totals = pipeline.p2p_bytes(dims.pp, pp_rank, microbatches, message, config.virtual_stages)
    return [
        Collective(op, "pp", phase, float(total), total // message, 2) for (op, phase), total in totals.items() if total
    ]


def sequence_collectives(config: ModelConfig, dims: ParallelDims, rows: int) -> list[Collective]:
    """The sequence dims' collectives of one step: ``config.sequence_scheme`` on cp, and with a ulysses dim
    the all-to-alls that reshard heads around it (module docstring, "Sequence schemes"); ``rows``
    sequences per rank."""
    cp, ulysses, layers, scheme = dims.cp, dims.ulysses, config.n_layers, config.sequence_scheme
    per_token = rows * (config.seq_len // (cp * ulysses)) * config.head_dim * config.precision.compute
    q, k = per_token * config.n_heads // dims.tp, per_token * config.kv_heads_per_rank(dims.tp)
    # after a ulysses all-to-all a rank holds ulysses times the tokens and 1/ulysses of the heads: the same K
    calls = [("all_to_all", "ulysses", ulysses, p, b) for p, b in _head_resharding(q, k)] if ulysses > 1 else []
    if cp == 1:
        pass
    elif scheme == SequenceScheme.ALL_GATHER:
        calls += [("all_gather", "cp", cp, "forward", 2 * k * cp), ("reduce_scatter", "cp", cp, "backward", 2 * k * cp)]
        if get_stack(config.stack).cp_kv_saved == "local":  # the K/V gathered again for the backward
            calls.append(("all_gather", "cp", cp, "backward", 2 * k * cp))
    elif scheme == SequenceScheme.RING:
        a = config.precision.compute
        grads = 2 * k * max(a, 4) // a
        blocks = [("forward", 2 * k)] * (cp - 1) + [("backward", 2 * k)] * (cp - 2) + [("backward", grads)] * (cp - 1)
        calls += [(op, "cp", cp, phase, b) for phase, b in blocks for op in ("send", "recv")]
    elif scheme == SequenceScheme.ULYSSES:
        calls += [("all_to_all", "cp", cp, phase, b) for phase, b in _head_resharding(q, k)]
    else:
        raise ValueError(f"the cost model has no bytes for the sequence scheme {scheme!r}; add them here")
    return merged([Collective(op, group, phase, layers * b, layers, n) for op, group, n, phase, b in calls])


def _head_resharding(q: float, k: float) -> list[tuple[str, float]]:
    """(phase, bytes) of Ulysses' all-to-alls per layer: the stacked q/k/v (GQA: q, then stacked K/V) and
    the output in forward, the same in reverse in backward."""
    inputs = [q + 2 * k] if q == k else [q, 2 * k]
    return [(phase, b) for phase in ("forward", "backward") for b in (*inputs, q)]


def sequence_bytes_per_layer(config: ModelConfig, dims: ParallelDims, rows: int) -> dict[str, float]:
    """One layer's sequence-scheme traffic on one rank: ``forward`` and ``backward`` full buffers (the
    trace convention; a ring's sends, what it receives being its neighbour's sends) and ``sent``, the
    bytes the rank puts on the wire in both phases (a ring's sends whole; all-gather, reduce-scatter and
    even all-to-alls (n-1)/n)."""
    result = {"forward": 0.0, "backward": 0.0, "sent": 0.0}
    for c in sequence_collectives(config, dims, rows):
        if c.op == "recv":
            continue
        per_layer = c.bytes / config.n_layers
        result[c.phase] += per_layer
        result["sent"] += per_layer * wire_factor(c.op, c.group_size)
    return result


def by_op_group(collectives: list[Collective]) -> dict[tuple[str, str], float]:
    """Bytes per (op, group), both phases summed: the key of ``hyper_parallel.viz.volume``."""
    total: dict[tuple[str, str], float] = defaultdict(float)
    for c in collectives:
        total[(c.op, c.group)] += c.bytes
    return dict(total)


def counts(collectives: list[Collective]) -> dict[tuple[str, str, str], int]:
    """Number of calls per (op, group, phase), the key of ``tests/test_recipes.py``."""
    total: dict[tuple[str, str, str], int] = defaultdict(int)
    for c in collectives:
        total[(c.op, c.group, c.phase)] += c.count
    return dict(total)
