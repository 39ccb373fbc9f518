"""Worker for tests/test_cp_attention.py: every CP attention case in one process group.

For each cp layout of this world size (all ranks in one cp group; cp groups of 2 with tp=2, whose
ranks are not contiguous; a cp group of one) and each case (impl, causal, dtype, GQA), it compares
``unshard(attention(shard(q), shard(k), shard(v)))`` (CP's all-gather, the ring on the zig-zag layout
and on contiguous blocks, and Ulysses) and the unsharded q/k/v gradients with the unsplit float64
``scaled_dot_product_attention``, and records the attention call's collectives and the ring's steps. For
the ring and the all-gather it also measures each rank's attention FLOPs (``FlopCounterMode``,
forward and backward) and the bytes autograd saves for backward. Results go to
$HYPER_PARALLEL_RUN_DIR/cp_rank<R>.json; the test asserts on them.
"""

import copy
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from hyper_parallel import comm, trace
from hyper_parallel.comm import GroupInfo
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import build_mesh
from hyper_parallel.models.transformer import Transformer, TransformerConfig, lm_loss, token_batch
from hyper_parallel.parallel import ulysses
from hyper_parallel.parallel.cp import attention_core, context_parallel_attention
from hyper_parallel.parallel.ring import ring_attention
from hyper_parallel.parallel.sequence_layout import shard_sequence, ulysses_ring_positions, unshard_sequence
from hyper_parallel.recipes.activation_memory import SavedActivations

BATCH, HEADS, HEAD_DIM = 2, 4, 8
SEQ_LEN = 32


def layouts(world: int) -> list[dict]:
    """(name, ParallelDims) pairs: full cp, cp=2 x tp=2 (cp groups {0,2} and {1,3}), cp of one."""
    out = [("cp_all", ParallelDims(world_size=world, cp=world))]
    if world == 4:
        out.append(("cp2_tp2", ParallelDims(world_size=world, cp=2, tp=2)))
    out.append(("cp1", ParallelDims(world_size=world, cp=1)))
    return out


CASES = [  # impl, causal, dtype, kv_heads, seq_len
    ("all_gather", True, torch.float32, HEADS, SEQ_LEN),
    ("all_gather", False, torch.float32, HEADS, SEQ_LEN),
    ("all_gather", True, torch.float32, HEADS // 2, SEQ_LEN),
    ("all_gather", True, torch.float64, HEADS, SEQ_LEN),
    ("all_gather", True, torch.float32, HEADS, 2 * SEQ_LEN),
    ("ring", True, torch.float32, HEADS, SEQ_LEN),
    ("ring", False, torch.float32, HEADS, SEQ_LEN),
    ("ring", True, torch.float32, HEADS // 2, SEQ_LEN),
    ("ring", True, torch.float64, HEADS, SEQ_LEN),
    ("ring_contiguous", True, torch.float32, HEADS, SEQ_LEN),
    ("ring_contiguous", False, torch.float32, HEADS, SEQ_LEN),
    ("ring_contiguous", True, torch.float32, HEADS // 2, SEQ_LEN),
    ("ulysses", True, torch.float32, HEADS, SEQ_LEN),
    ("ulysses", False, torch.float32, HEADS, SEQ_LEN),
    ("ulysses", True, torch.float64, HEADS, SEQ_LEN),
    ("ulysses", True, torch.float32, HEADS // 2, SEQ_LEN),  # GQA: skipped where cp does not divide 2 K/V heads
]


TWO_D_CASES = [(True, HEADS), (False, HEADS), (True, HEADS // 2)]  # causal, kv_heads (GQA: 2 K/V heads)


def attention(impl: str):
    """The attention under test: CP's ``impl``, the ring on contiguous blocks, or Ulysses; same signature."""
    if impl == "ulysses":
        return ulysses.ulysses_attention
    if impl == "ring_contiguous":
        return lambda *args, **kwargs: ring_attention(*args, zigzag=False, **kwargs)
    return lambda *args, **kwargs: context_parallel_attention(*args, impl=impl, **kwargs)


def zigzag(impl: str) -> bool:
    """Whether ``impl`` runs on the zig-zag layout (every one but the ring on contiguous blocks)."""
    return impl != "ring_contiguous"


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def run_case(
    cp: GroupInfo, impl: str, causal: bool, dtype: torch.dtype, kv_heads: int, seq_len: int, seed: int
) -> dict:
    gen = torch.Generator().manual_seed(seed)  # identical full tensors on every rank
    q, k, v, grad_out = (
        torch.randn(BATCH, h, seq_len, HEAD_DIM, generator=gen, dtype=torch.float64)
        for h in (HEADS, kv_heads, kv_heads, HEADS)
    )
    ref_in = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_in, is_causal=causal, enable_gqa=kv_heads != HEADS)
    ref.backward(grad_out)

    layout = zigzag(impl)
    local = [shard_sequence(t.to(dtype), 2, cp, layout).detach().requires_grad_(True) for t in (q, k, v)]
    positions = shard_sequence(torch.arange(seq_len), 0, cp, layout)
    with trace.record() as rec:
        with trace.labels(phase="forward", module="attention"):
            out = attention(impl)(*local, cp, positions, causal=causal)
        with trace.labels(phase="other", module="unshard"):
            full = unshard_sequence(out, 2, cp, layout)
        with trace.labels(phase="backward", module="attention"):
            (full * grad_out.to(dtype)).sum().backward()
    grads = [unshard_sequence(t.grad, 2, cp, layout) for t in local]
    kv_bytes = BATCH * kv_heads * seq_len * HEAD_DIM * torch.finfo(dtype).bits // 8
    return {
        "impl": impl,
        "causal": causal,
        "dtype": str(dtype).removeprefix("torch."),
        "kv_heads": kv_heads,
        "seq_len": seq_len,
        "out_dtype": str(out.dtype).removeprefix("torch."),
        "out_shape": list(out.shape),
        "errors": {
            "out": _max_diff(full, ref),
            "dq": _max_diff(grads[0], ref_in[0].grad),
            "dk": _max_diff(grads[1], ref_in[1].grad),
            "dv": _max_diff(grads[2], ref_in[2].grad),
        },
        "kv_bytes": kv_bytes,  # one of K or V, whole sequence
        "local_kv_bytes": kv_bytes // cp.size,
        "out_bytes": kv_bytes // kv_heads * HEADS,  # the gathered output
        "events": [
            {
                key: e[key]
                for key in ("op", "group", "ranks", "bytes", "dtype", "phase", "module", "t_start", "t_end")
                + (("peer", "t_wait", "asynchronous") if "peer" in e else ())
            }
            for e in rec.events
            if e["kind"] == "collective"
        ],
        "ring_steps": [e for e in rec.events if e["kind"] == "ring"],
    }


def work_case(cp: GroupInfo, impl: str) -> dict:
    """One causal attention call, forward and backward, on random float32 inputs of SEQ_LEN tokens: the
    matmul FLOPs this rank ran (torch's FlopCounterMode) and the bytes autograd saved for backward."""
    gen = torch.Generator().manual_seed(123)
    q, k, v, grad = (torch.randn(BATCH, HEADS, SEQ_LEN, HEAD_DIM, generator=gen) for _ in range(4))
    layout = zigzag(impl)
    local = [shard_sequence(t, 2, cp, layout).requires_grad_(True) for t in (q, k, v)]
    positions = shard_sequence(torch.arange(SEQ_LEN), 0, cp, layout)
    saved = SavedActivations(torch.nn.Module())
    with FlopCounterMode(display=False) as flops:
        with saved.measure():
            out = attention(impl)(*local, cp, positions, causal=True)
        out.backward(shard_sequence(grad, 2, cp, layout))
    return {"flops": flops.get_total_flops(), "saved_bytes": saved.bytes}


def transformer_case(cp: GroupInfo, core=attention_core) -> dict:
    """The model's attention core swapped for CP attention (rotary uses the sharded global positions):
    loss and parameter gradients (summed over cp, each rank's loss being the mean of its tokens'
    losses, so divided by cp) equal the single-process model on the full sequence."""
    config = TransformerConfig(seq_len=32, n_layers=2)
    torch.manual_seed(0)
    reference = Transformer(config)
    model = copy.deepcopy(reference)
    for layer in model.layers:
        layer.attention.core = core(cp)
    tokens, targets = token_batch(config, batch=2, seed=1)
    ref_loss = lm_loss(reference(tokens), targets)
    ref_loss.backward()
    positions = shard_sequence(torch.arange(config.seq_len), 0, cp)
    loss = lm_loss(model(shard_sequence(tokens, 1, cp), positions), shard_sequence(targets, 1, cp))
    loss.backward()
    global_loss = comm.all_reduce(loss.detach().clone(), cp) / cp.size
    grad_err = 0.0
    for (_name, param), ref_param in zip(model.named_parameters(), reference.parameters()):
        grad = comm.all_reduce(param.grad.clone(), cp) / cp.size
        grad_err = max(grad_err, _max_diff(grad, ref_param.grad))
    return {"loss": _max_diff(global_loss, ref_loss), "param_grads": grad_err}


def invalid_inputs(cp: GroupInfo) -> dict:
    """Messages of the ValueErrors (or "no error") for inputs the cp layout must reject."""
    messages = {}
    bad_len = 2 * cp.size * 3 + cp.size  # divisible by cp, not by 2*cp
    checks = {
        "shard_bad_seq_len": lambda: shard_sequence(torch.zeros(1, bad_len), 1, cp),
        "wrong_positions": lambda: context_parallel_attention(
            *(torch.zeros(1, 1, SEQ_LEN // cp.size, 4) for _ in range(3)), cp, torch.arange(SEQ_LEN // cp.size)
        ),
        "ulysses_wrong_positions": lambda: ulysses.ulysses_attention(
            *(torch.zeros(1, cp.size, SEQ_LEN // cp.size, 4) for _ in range(3)), cp, torch.arange(SEQ_LEN // cp.size)
        ),
        "ulysses_heads": lambda: ulysses.ulysses_attention(
            *(torch.zeros(1, cp.size + 1, SEQ_LEN // cp.size, 4) for _ in range(3)),
            cp,
            shard_sequence(torch.arange(SEQ_LEN), 0, cp),
        ),
    }
    for name, check in checks.items():
        try:
            check()
            messages[name] = "no error"
        except ValueError as err:
            messages[name] = f"ValueError: {err}"
    return messages


def two_d_case(ulysses_group: GroupInfo, ring: GroupInfo, causal: bool, kv_heads: int, seed: int) -> dict:
    """2-D sequence parallelism (ulysses x ring): each rank's output and q/k/v gradients against float64 SDPA
    at the positions it holds (ulysses_ring_positions), and the attention call's collectives."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, grad_out = (
        torch.randn(BATCH, h, SEQ_LEN, HEAD_DIM, generator=gen, dtype=torch.float64)
        for h in (HEADS, kv_heads, kv_heads, HEADS)
    )
    ref_in = [t.clone().requires_grad_(True) for t in (q, k, v)]
    F.scaled_dot_product_attention(*ref_in, is_causal=causal, enable_gqa=kv_heads != HEADS).backward(grad_out)
    ref_out = F.scaled_dot_product_attention(
        *(t.detach() for t in ref_in), is_causal=causal, enable_gqa=kv_heads != HEADS
    )
    positions = ulysses_ring_positions(SEQ_LEN, ring.size, ring.index, ulysses_group.size, ulysses_group.index)
    local = [t[:, :, positions].float().requires_grad_(True) for t in (q, k, v)]
    with trace.record() as rec:
        with trace.labels(phase="forward", module="attention"):
            out = ulysses.ulysses_ring_attention(*local, ulysses_group, ring, positions, causal=causal)
        with trace.labels(phase="backward", module="attention"):
            out.backward(grad_out[:, :, positions].float())
    mine = (out, *(t.grad for t in local))
    theirs = (ref_out, *(t.grad for t in ref_in))
    return {
        "causal": causal,
        "kv_heads": kv_heads,
        "positions": positions.tolist(),
        "errors": {
            name: _max_diff(a, b[:, :, positions]) for name, a, b in zip(("out", "dq", "dk", "dv"), mine, theirs)
        },
        "local_kv_bytes": BATCH * kv_heads * len(positions) * HEAD_DIM * 4,
        "local_q_bytes": BATCH * HEADS * len(positions) * HEAD_DIM * 4,
        "events": [
            {key: e[key] for key in ("op", "group", "phase", "bytes")} for e in rec.events if e["kind"] == "collective"
        ],
    }


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    started = time.perf_counter()
    result = {"rank": rank, "world_size": world, "layouts": {}}
    for name, dims in layouts(world):
        views = build_mesh(dims, "cpu")
        cp = GroupInfo.from_mesh(views.dense, (MeshDim.CP,))
        entry = {
            "cp_ranks": list(cp.ranks),
            "cp_index": cp.index,
            "positions_16": shard_sequence(torch.arange(16), 0, cp).tolist(),
            "cases": [],
        }
        for seed, case in enumerate(CASES):
            impl, kv_heads = case[0], case[3]
            if impl == "ulysses" and kv_heads % cp.size:
                continue
            entry["cases"].append(run_case(cp, *case, seed=seed))
        entry["work"] = {impl: work_case(cp, impl) for impl in ("all_gather", "ring", "ring_contiguous")}
        entry["transformer"] = transformer_case(cp)
        entry["transformer_ring"] = transformer_case(cp, lambda group: attention_core(group, "ring"))
        entry["transformer_ulysses"] = transformer_case(cp, ulysses.attention_core)
        if cp.size > 1:
            entry["invalid"] = invalid_inputs(cp)
        result["layouts"][name] = entry
    if world == 4:  # 2-D: ulysses 2 inside cp 2 (ulysses groups {0, 1}, {2, 3}; rings {0, 2}, {1, 3})
        views = build_mesh(ParallelDims(world_size=4, cp=2, ulysses=2), "cpu")
        groups = [GroupInfo.from_mesh(views.dense, (dim,)) for dim in (MeshDim.ULYSSES, MeshDim.CP)]
        result["two_d"] = {
            "ulysses_ranks": list(groups[0].ranks),
            "ring_ranks": list(groups[1].ranks),
            "cases": [two_d_case(*groups, causal, kv, seed) for seed, (causal, kv) in enumerate(TWO_D_CASES)],
        }
    result["seconds"] = time.perf_counter() - started
    Path(os.environ["HYPER_PARALLEL_RUN_DIR"], f"cp_rank{rank}.json").write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
