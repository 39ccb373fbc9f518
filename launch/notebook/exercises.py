"""Exercises that check themselves: predict a number (or a set, or a mesh), then compare with the run.

A notebook asks, the learner writes an answer into a cell, and a checker compares it with the truth
taken from the run (its traces, its metrics) or from the cost model, never from a number typed into
the notebook:

    ask("01.1")                                        the question (Markdown)
    answer = None                                      the learner's cell; None = not answered yet
    check("01.1", answer, collective_count(results["M4"], "all_gather"))
    show_solution("01.1")                              the worked answer, folded until clicked

``None`` prints the hint and passes, so a notebook runs headless under papermill with every answer
still open; a wrong answer prints why and what to look at, never raises. Every checker returns
``"unanswered"``, ``"right"`` or ``"wrong"`` (tests/test_exercises.py holds each exercise to a right
and a wrong answer).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class Verdict(str):
    """ "unanswered", "right" or "wrong": compares as the plain string; Jupyter shows nothing for it (the
    checker already printed its sentence), so a check cell's output is that sentence alone."""

    def _ipython_display_(self) -> None:
        pass


UNANSWERED, RIGHT, WRONG = Verdict("unanswered"), Verdict("right"), Verdict("wrong")
GIB = 1024**3


@dataclass(frozen=True)
class Exercise:
    question: str
    hint: str
    solution: str


EXERCISES: dict[str, Exercise] = {
    "00.1": Exercise(
        "M4 (FSDP on 2 ranks) trains an MLP of 2 blocks plus a root unit. **How many reduce-scatters** does "
        "rank 0 issue in one step?",
        "one per fully_shard unit: count the units.",
        "3: every unit reduce-scatters its gradients once in backward (block 0, block 1, root).",
    ),
    "00b.1": Exercise(
        "A GPU node: 8 GPUs on NVLink, the `nvlink` link below (alpha = 1 us per step, beta = 360 GB/s per GPU, "
        "the planner's h100-sxm preset). Predict the time of a **ring all-reduce of 1 GiB** (2**30 bytes) over "
        "the 8 GPUs, in **milliseconds**.",
        "a ring all-reduce takes 2(n-1) steps and each rank sends 2(n-1)/n of the buffer: "
        "t = 2(n-1) alpha + 2(n-1)/n x bytes / beta.",
        "5.23 ms = 14 x 1 us + 1.75 x 2**30 B / 360e9 B/s: 0.014 ms of latency and 5.22 ms of bandwidth, so at "
        "1 GiB only beta matters.",
    ),
    "00b.2": Exercise(
        "Still on those 8 GPUs: which all-reduce is cheaper, `'ring'` or `'tree'`, for **1 KiB** and for "
        '**1 GiB**? Answer a dict, e.g. `{"1 KiB": "ring", "1 GiB": "ring"}`.',
        "the ring takes 2(n-1) = 14 steps, the tree 2 log2(n) = 6; the ring sends 2(n-1)/n = 1.75 bytes per "
        "byte of buffer, the tree 2. Which term dominates at 1 KiB, which at 1 GiB?",
        "tree for 1 KiB (latency-bound: 6 steps instead of 14), ring for 1 GiB (bandwidth-bound: 1.75 bytes "
        "sent per byte instead of 2); they cost the same at n (n - 1 - log2 n) alpha beta = 11.0 MiB.",
    ),
    "01.1": Exercise(
        "Predict: how many **all-gathers** does rank 0 of M4 issue per step (2 blocks + root, blocks "
        "reshard after forward, the root keeps its parameters)?",
        "forward gathers every unit once; backward gathers again only the units that resharded.",
        "5: 3 in forward (root, block 0, block 1) + 2 in backward (the blocks; the root kept its parameters).",
    ),
    "01.2": Exercise(
        "M4 has three units: `'root'` (input projection and head), `'blocks.0'`, `'blocks.1'`. Backward "
        "runs head first, then blocks.1, then blocks.0. **Which unit is not all-gathered again in "
        "backward**, and why? Answer its name.",
        "a unit is gathered again only if it freed its parameters after its forward; which unit's forward "
        "ends last, right before backward needs it again?",
        "'root': its forward (the input projection at the start, the head at the end) spans the whole "
        "step, and backward starts with the head, so FSDP keeps the root gathered from forward to "
        "backward (reshard_after_forward=False for the root, as torch FSDP2 does); the blocks reshard "
        "after their forward and are gathered again.",
    ),
    "03.1": Exercise(
        "Predict: how many **all-reduces on tp** does M2 (pure TP, 2 layers) issue in **forward**?",
        "one after every rowwise layer (wo, w2 in each layer), and one after the rowwise embedding.",
        "5 = 2 per layer x 2 layers + 1 for the embedding.",
    ),
    "03.2": Exercise(
        "M2 and M3 put the same bytes on the wire. Which of them keeps **fewer activation bytes** for "
        "backward per rank (what autograd saves in forward), `'M2'` (TP) or `'M3'` (TP + SP)?",
        "which tensors of a block are split over tp in both runs (heads, hidden units), and which are "
        "whole in M2 but a tp-th of the sequence in M3 (norms, residual stream)?",
        "M3: its norms and residual stream hold 1/tp of the sequence, where M2 keeps them whole on every "
        "rank. The saving is less than 1/tp: the colwise layers' inputs are all-gathered (whole "
        "sequence) in both, and q, k, v, attention and the feed-forward hidden are split by heads / "
        "hidden units in both. That memory is SP's gain; the bytes on the wire are the same.",
    ),
    "03.3": Exercise(
        "M3 issues 11 collectives on tp in **forward** per step (2 layers: 2 all-gathers + 2 reduce-scatters "
        "each, the embedding's reduce-scatter, the head's and the logits' all-gathers). Predict: **how many** "
        "does M3-A (async TP, tp = 2 chunks) issue?",
        "only the blocks' gathers and scatters are cut into tp chunks; the embedding's, the head's and the "
        "logits' stay whole.",
        "19 = 8 block collectives x 2 chunks + 3 whole ones: the bytes are M3's, in twice the pieces, so each "
        "chunk's matmul can run while the next chunk is on the wire.",
    ),
    "03.4": Exercise(
        "M3-F8 casts each block input to float8 (e4m3, 1 byte per value) before its all-gather over tp. What "
        "**fraction** of M3's float32 bytes do those forward all-gathers move? Answer a number.",
        "float32 is 4 bytes per value; the scale (one float per tensor) is not gathered.",
        "0.25: a quarter of float32's bytes (half of bf16's), for the same values gathered.",
    ),
    "05.1": Exercise(
        "Predict: how many **all-gathers** does rank 0 of M7 (HSDP 2 x 2, 2 layers + root) issue per step?",
        "HSDP gathers only on fsdp, exactly as FSDP does; dp_replicate is never gathered.",
        "5: 3 in forward + 2 in backward, as M4; HSDP adds 3 all-reduces on dp_replicate, no all-gather.",
    ),
    "05.2": Exercise(
        "Pick degrees for `llama-8b-like` on **64 ranks** with HSDP (`dp_replicate > 1`, tp = cp = 1) so "
        "that every rank's **training state** (parameters + gradients + Adam state, the cost model's "
        "`memory`) fits in **16 GiB**. Answer a dict, e.g. `{'dp_replicate': 32, 'dp_shard': 2}`.",
        "the state shrinks with dp_shard, not with dp_replicate: 8.0e9 parameters x 16 B (float32 master "
        "weights 4 + float32 gradients 4 + Adam's two float32 moments 8; the bf16 copy exists only while a "
        "unit is gathered) are about 120 GiB before sharding (02_memory).",
        "any dp_shard >= 8: {'dp_replicate': 8, 'dp_shard': 8} keeps 15.0 GiB per rank, dp_shard = 4 "
        "keeps 29.9 GiB. (Activations depend on the batch per rank, not on how parameters are sharded.)",
    ),
    "04.1": Exercise(
        "With cp = 4 the sequence is cut into 8 chunks. **Which chunks** does cp rank 1 hold? "
        "Answer a set, e.g. `{1, 2}`.",
        "rank i holds chunk i and its mirror image 2cp-1-i, so every rank gets as much of the causal mask.",
        "{1, 6}: rank 1 holds chunk 1 and chunk 2*4-1-1 = 6.",
    ),
    "04.2": Exercise(
        "Zig-zag on cp = 4: a block of keys is a 2 x 2 grid of (query chunk, key chunk) pairs (rank 1 holds "
        "chunks 1 and 6 of 8). In one causal forward of the ring, **how many pairs** does rank 1 compute, "
        "over its own block and the 3 that pass by?",
        "a pair is skipped when every query precedes every key; on its own block the chunk 1 x chunk 6 pair "
        "is skipped. For another rank j's block, compare chunk j and 2cp-1-j with chunks 1 and 6.",
        "9: 3 on its own block (1x1 and 6x6 masked, 6x1 whole) and 2 whole pairs on each of the 3 others, "
        "the same on every rank: that is the load balance. With contiguous blocks rank r computes its own "
        "block and the r blocks before it: rank 3 four times rank 0's work.",
    ),
    "04.3": Exercise(
        "M5-R on cp = 4: in **backward**, how many blocks does one attention layer **send** per rank "
        "(each send one block: K and V, or their gradients)?",
        "backward retraces the ring: every K/V block visits the ranks again, but a rank keeps its own; each "
        "block's dK/dV travels with it and must arrive at its owner.",
        "5 = (cp - 2) + (cp - 1): 2 K/V blocks (the block held at the end of forward is kept, and the owner's "
        "own block never travels back) and 3 blocks of gradients, each to the previous rank.",
    ),
    "08.1": Exercise(
        "Predict: how many **all-to-alls on ep** does rank 0 of S1 issue per step (one MoE layer)?",
        "forward: the token counts, the dispatch, the combine; backward: the two token exchanges reversed.",
        "5: 3 in forward (counts, dispatch, combine) + 2 in backward (the counts need no gradient).",
    ),
    "08.2": Exercise(
        "In S1 (4 ranks, ep = 2) the experts are one fully_shard unit on `efsdp` = 4 / 2 = 2 ranks. How "
        "many collectives does rank 0 issue **on efsdp** per step?",
        "the expert unit is an FSDP unit like a block in 01: it is not the root; count what it does "
        "in forward, in backward, and with its gradients.",
        "3: one all-gather before the experts compute in forward, one again in backward (the unit "
        "resharded after forward), one reduce-scatter of the expert gradients. (In S2, ep x etp = 2 x 2 "
        "spans the 4 ranks: efsdp = 1, and nothing is communicated on it.)",
    ),
    "10.1": Exercise(
        "Which parameters **drift** (differ between the two TP ranks) without the fix? Answer a set of names, "
        "e.g. `{'blocks.0.w1.weight'}`.",
        "TP-replicated parameters that see only a sequence chunk under SP.",
        "the norm weights and the rowwise layers' biases of every block (blocks.N.norm.weight, blocks.N.w2.bias):"
        " replicated on tp, but each TP rank computes their gradient from its own sequence chunk only.",
    ),
    "10.2": Exercise(
        "How many **extra all-reduces on tp** does the fix add per step on rank 0?",
        "one per fully_shard unit that has parameters with partial gradients.",
        "2: one all-reduce over tp per block unit (blocks.0, blocks.1), each summing that block's partial "
        "gradients (norm weight and w2 bias) in one buffer; the root unit has none (the table below: 0 -> 2).",
    ),
    "06.1": Exercise(
        "With `world_size=8, dp_shard=8, ep=2` (etp = 1), how many ranks are in one **efsdp** group (the ranks "
        "that shard the same experts' weights)?",
        "EP borrows its ranks from dp_shard * cp * tp; what is left over shards the experts: "
        "efsdp = dp_shard * cp * tp / (ep * etp).",
        "4 = 8 / 2: two ep ranks hold different experts, and each expert's weights are sharded over 4 ranks.",
    ),
    "07.1": Exercise(
        "In M7 (HSDP: shard_size = fsdp = 2, dp_size = dp_replicate = 2) each unit reduce-scatters its "
        "gradient on fsdp, then all-reduces on dp_replicate. What **fraction of the reduce-scatter's "
        "buffer** does the all-reduce carry? Answer a number, e.g. `1.0` if it is the same tensor.",
        "what does the reduce-scatter leave on each rank, and what still differs between the replicas?",
        "0.5 = 1 / shard_size: the reduce-scatter leaves each rank the sum over fsdp of its own shard; "
        "only that shard still differs between replicas, so only it is all-reduced. HSDP's traffic "
        "across replicas falls as the shard group grows: RS(shard_size) + AR(dp_size) of the shard.",
    ),
    "91.1": Exercise(
        "Predict: under HSDP 2 x 2 (the 4-rank benchmark), how many collectives on the FSDP groups "
        "(fsdp and dp_replicate) does **one block** issue per step, ours or torch's?",
        "what a block does: gathered for forward, gathered again for backward (it resharded), its gradients "
        "reduce-scattered, and HSDP's extra step across replicas.",
        "4: 2 all-gathers and 1 reduce-scatter on fsdp, 1 all-reduce of the shard on dp_replicate (the root: 3, "
        "it is not gathered again in backward).",
    ),
    "02.1": Exercise(
        "Training with bf16 compute, float32 master weights and Adam (the usual mixed precision): how many "
        "**bytes per parameter** does the sharded state keep between steps (weights + gradients + optimizer)?",
        "the optimizer updates float32 weights with float32 gradients, and Adam keeps two float32 moments; "
        "the bf16 copy exists only while a unit is gathered.",
        "16 = 4 (float32 master weights) + 4 (float32 gradients) + 8 (Adam m and v): 8.0e9 parameters are about "
        "120 GiB before sharding; the bf16 copy (2 B) is transient.",
    ),
    "02.2": Exercise(
        "With `reshard_after_forward=False` on the two blocks too, how many **all-gathers** does rank 0 of "
        "the M4 MLP (2 blocks + root) issue per step?",
        "a unit that keeps its parameters after forward does not gather them again in backward.",
        "3: one per unit in forward and none in backward (ZeRO-2-like), against 5 by default; the price is "
        "every block's gathered parameters held from forward to backward.",
    ),
    "02.3": Exercise(
        "The same step as **2 micro-batches** of half the rows (gradient accumulation): the largest saved "
        "activations of one forward are what fraction of the single-batch ones? Answer a number, e.g. `0.25`.",
        "what autograd saves grows with the rows of one forward, not with the step's batch.",
        "0.5: every saved tensor has the micro-batch's rows; the parameters, gradients and Adam state do not change.",
    ),
    "09.1": Exercise(
        "With p = 2 stages and 1F1B, what is the **smallest number of microbatches m** that brings the "
        "bubble down to **10 % or less** of the step?",
        "the bubble is (p - 1) / (m + p - 1): solve it for m, then round up to a whole microbatch.",
        "9: 1 / (m + 1) <= 0.1 needs m + 1 >= 10. More microbatches shrink the bubble but each is smaller "
        "(less work per send, more per-microbatch overhead), and GPipe would hold all m activations at once.",
    ),
    "09.2": Exercise(
        "P1 (1F1B, pp = 2, 4 microbatches; stage 0 = the embedding root + 2 layer units) with "
        "`reshard_after_forward=True`: **how many all-gathers** does rank 0 issue per step? (By default, "
        "with no reshard after forward under PP, it issues 3: one per unit.)",
        "rank 0 runs F0 F1 B0 F2 B1 F3 B2 B3; the root keeps its parameters; a layer resharded after a "
        "forward is gathered again by the next forward or backward, and torch's schedule keeps it after a "
        "backward.",
        "11: per layer 2 in forward (F0, F1) and 3 in backward (B0, B1, B2), 5 x 2 layers, plus the root's "
        "one. The peak memory is the same as without resharding: after every backward the whole stage is "
        "gathered anyway.",
    ),
    "11.1": Exercise(
        "Choose the degrees for this notebook's model and cluster (the parameters cell: `model`, `world_size`, "
        '`gpus_per_node`, `hardware`) by the three steps above, as a dict such as `{"dp_shard": 64, "tp": 2}`. '
        "It is right when it fits the memory budget and its modelled step is within 10 % of the fastest layout "
        "the planner finds.",
        "step 2 first at scale: dp = world_size / (tp * cp * pp) must divide the model's global batch "
        "(`config.global_batch`); then keep tp inside a node and take the fewest model-parallel ranks that fit; "
        "and count a ring's steps: a collective over n ranks pays n - 1 latencies.",
        "With the defaults (llama-8b-like, a global batch of 512 sequences, 4096 GPUs): dp must divide 512, so "
        "tp * cp * pp is at least 8 (4096 / 512); tp = 8 inside each node leaves 512 data-parallel ranks. As one "
        "FSDP group (dp_shard = 512) they fit (step 1) but each all-gather and reduce-scatter is a ring of 512 "
        "ranks, 511 steps of latency each, which the layer's compute cannot hide: about 3x the best step. The "
        "planner's first (step 3) splits the same 512 as HSDP, dp_replicate = 64 x dp_shard = 8 (rings of 8, one "
        "all-reduce over the 64 replicas); its neighbours 128 x 4 and 32 x 16 step as fast. tp = 4 with cp = 2 "
        "fits too but waits for more communication per step, so it is slower.",
    ),
    "12.1": Exercise(
        "Your model has 2 blocks, each an attention and a feed-forward under the TP plan below "
        "(`wq`/`wk`/`wv` and `up` column-wise, `wo` and `down` row-wise, `PrepareModuleInput` on each "
        "sub-module). How many **all-reduces on tp** does rank 0 issue in one training step, forward and backward?",
        "a row-wise layer leaves partial sums: one all-reduce of its output in forward; in backward the "
        "input gradient of each sub-module is summed over its column-wise layers, then all-reduced once.",
        "8: per block 2 in forward (the outputs of `wo` and `down`) and 2 in backward (the input gradients of "
        "`attention` and `feed_forward`), times 2 blocks. fully_shard's collectives are on fsdp, not tp.",
    ),
    "90.1": Exercise(
        "Is `world_size=16, dp_shard=4, cp=2, tp=2, ep=4, etp=1` a valid mesh? Answer True or False.",
        "with etp = 1 EP borrows all of cp * tp and part of dp_shard: ep must be a multiple of cp * tp and "
        "divide dp_shard * cp * tp (06 showed a mesh that breaks the first rule).",
        "True: ep = 4 is a multiple of cp * tp = 4 (every EP group holds whole cp x tp blocks) and divides "
        "dp_shard * cp * tp = 16; ep = 2 would break the first rule, as 06's dp_shard=2, cp=2, tp=2, ep=2 did.",
    ),
}


def exercise(key: str) -> Exercise:
    if key not in EXERCISES:
        raise ValueError(f"unknown exercise {key!r}; known: {sorted(EXERCISES)}")
    return EXERCISES[key]


def ask(key: str):
    """The question as Markdown, with where to write the answer."""
    from IPython.display import Markdown

    return Markdown(
        f"**Exercise {key}.** {exercise(key).question}\n\n*Write your answer into the `answer_...` "
        f"variable of the next cell and run it; a cell further down checks it against the run. "
        f'`show_solution("{key}")` unfolds the worked answer.*'
    )


def show_solution(key: str):
    """The worked answer, folded in a ``<details>`` block (click to open)."""
    from IPython.display import HTML

    return HTML(
        f"<details><summary>Solution {html.escape(key)} (click to open)</summary>"
        f"<p>{html.escape(exercise(key).solution)}</p></details>"
    )


def _verdict(key: str, answer: Any, right: bool, expected_text: str, source: str) -> str:
    if right:
        print(f"✔ {key}: right — {expected_text} ({source}).")
        return RIGHT
    print(f"✘ {key}: {answer!r} is not it ({source} says otherwise). Hint: {exercise(key).hint}")
    return WRONG


def _unanswered(key: str) -> str:
    print(f"… {key}: not answered yet (answer = None). Hint: {exercise(key).hint}")
    return UNANSWERED


def check(key: str, answer: Any, expected: Any, source: str = "the run") -> str:
    """Compare ``answer`` with ``expected``: numbers within 1e-6 relative, sets/lists as sets of
    their string forms, strings without spaces and case, anything else by ``==``."""
    exercise(key)
    if answer is None:
        return _unanswered(key)
    if isinstance(expected, bool) or isinstance(answer, bool):
        right = bool(answer) == bool(expected) and isinstance(answer, bool)
    elif isinstance(expected, (int, float)):
        try:
            right = abs(float(answer) - float(expected)) <= 1e-6 * max(1.0, abs(float(expected)))
        except (TypeError, ValueError):
            right = False
    elif isinstance(expected, (set, frozenset, list, tuple)):
        given = answer if isinstance(answer, (set, frozenset, list, tuple)) else [answer]
        right = {str(a) for a in given} == {str(e) for e in expected}
    elif isinstance(expected, str):
        right = isinstance(answer, str) and answer.replace(" ", "").lower() == expected.replace(" ", "").lower()
    else:
        right = answer == expected
    shown = sorted(map(str, expected)) if isinstance(expected, (set, frozenset)) else expected
    return _verdict(key, answer, right, f"{shown}", source)


def check_within(key: str, answer: Any, expected: float, within: float = 0.05, unit: str = "") -> str:
    """A number predicted by hand from a model: right within ``within`` (relative) of ``expected``."""
    exercise(key)
    if answer is None:
        return _unanswered(key)
    try:
        right = abs(float(answer) - expected) <= within * abs(expected)
    except (TypeError, ValueError):
        right = False
    return _verdict(key, answer, right, f"{expected:.4g} {unit}".strip(), f"the alpha-beta model, within {within:.0%}")


def _answered_mesh(key: str, answer: Any, world_size: int):
    """The learner's degrees as ``ParallelDims`` of ``world_size`` ranks, or the verdict when there is none to
    check (unanswered, not a dict, not a valid mesh: each with its sentence printed)."""
    from hyper_parallel.mesh import ParallelDims

    exercise(key)
    if answer is None:
        return _unanswered(key)
    if not isinstance(answer, Mapping):
        return _verdict(key, answer, False, "", "a mesh is a dict of degrees")
    try:
        return ParallelDims(world_size=world_size, **dict(answer))
    except (TypeError, ValueError) as error:
        print(f"✘ {key}: {dict(answer)} is not a valid mesh of {world_size} ranks: {error}")
        return WRONG


def check_fits(
    key: str,
    answer: Mapping[str, int] | None,
    *,
    model: str,
    world_size: int,
    budget_gib: float,
    need: Mapping[str, Any] | None = None,
) -> str:
    """A mesh the learner picked: valid (``ParallelDims``), holding ``need`` (e.g. ``{"dp_replicate": ">1"}``)
    and with its training state (parameters + gradients + optimizer state, the cost model's memory)
    within ``budget_gib`` per rank. There are several right answers."""
    from hyper_parallel.cost_model import estimate, get_model

    dims = _answered_mesh(key, answer, world_size)
    if isinstance(dims, Verdict):
        return dims
    try:
        memory = estimate(get_model(model), dims).memory
    except ValueError as error:
        print(f"✘ {key}: {dict(answer)} does not fit {model}: {error}")
        return WRONG
    total = memory.parameters + memory.gradients + memory.optimizer
    for name, rule in (need or {}).items():
        value = getattr(dims, name)
        if (rule == ">1" and value <= 1) or (isinstance(rule, int) and value != rule):
            print(
                f"✘ {key}: {name}={value}, but the exercise asks for {name} {rule if rule == '>1' else '= ' + str(rule)}."
            )
            return WRONG
    source = f"the cost model: {total / GIB:.1f} GiB of state per rank against {budget_gib} GiB"
    return _verdict(key, dict(answer), total <= budget_gib * GIB, f"{dict(answer)} fits", source)


def check_layout(key: str, answer: Mapping[str, int] | None, ranked, world_size: int, within: float = 0.10) -> str:
    """A layout the learner picked for the planner's model and cluster: right when it fits the memory
    budget and its modelled step is within ``within`` of the fastest layout that fits (``ranked``:
    ``rank_layouts``' list, best first). Several answers are right; a wrong one is told which step of
    the procedure it fails, or how far it is from the best and where the time goes."""
    dims = _answered_mesh(key, answer, world_size)
    if isinstance(dims, Verdict):
        return dims
    position = next((i for i, r in enumerate(ranked) if r.dims == dims), None)
    if position is None:
        print(
            f"✘ {key}: {dict(answer)} is no layout the planner can cost for this model (step 2: does dp divide the global batch?)."
        )
        return WRONG
    mine, best = ranked[position], ranked[0]
    place = f"#{position + 1} of {len(ranked)}: {mine.step_seconds:.3f} s per step against the best {best.step_seconds:.3f} s"
    if not mine.fits:
        print(
            f"✘ {key}: {dict(answer)} needs {mine.memory_bytes / GIB:.1f} GiB per rank, over the budget (step 1). {place}."
        )
        return WRONG
    if mine.step_seconds > (1 + within) * best.step_seconds:
        print(
            f"✘ {key}: {dict(answer)} fits but is {mine.step_seconds / best.step_seconds - 1:.0%} slower than the best "
            f"(step 3): {place}; waited-for communication {mine.exposed_seconds:.3f} s against "
            f"{best.exposed_seconds:.3f} s, bubble {mine.bubble_seconds:.3f} s against {best.bubble_seconds:.3f} s."
        )
        return WRONG
    return _verdict(key, dict(answer), True, place, "the planner's ranking")


# ---------------------------------------------------------------- truths taken from a run


def collective_count(
    result, op: str | None = None, group: str | None = None, phase: str | None = None, rank: int = 0
) -> int:
    """How many collectives (of ``op``, on ``group``, in ``phase``; None: any) rank ``rank`` issued in the
    run's last step, from its trace."""
    from launch.notebook.tables import collective_counts

    return sum(
        n
        for (p, o, g), n in collective_counts(result, rank=rank).items()
        if (op is None or o == op) and (group is None or g == group) and (phase is None or p == phase)
    )


def wire_bytes_per_rank(result, rank: int = 0) -> float:
    """Bytes rank ``rank`` sends in the last step with ring algorithms (all-reduce 2(n-1)/n of its buffer,
    the other collectives (n-1)/n)."""
    from hyper_parallel.cost_model import wire_factor

    traces = result if isinstance(result, Mapping) else result.traces
    events = [e for e in traces.get(rank, []) if e.get("kind") == "collective" and e.get("phase") != "init"]
    if not events:
        return 0.0
    last = max(e["step"] for e in events)
    return sum(e["bytes"] * wire_factor(e["op"], len(e["ranks"])) for e in events if e["step"] == last)


def float8_gather_share(float8_result, float32_result, rank: int = 0) -> float:
    """Bytes of the float8 run's forward all-gathers in float8 over the float32 run's of the same blocks
    (the last step on ``rank``): what float8 TP does to the block inputs' gathers (03.4)."""

    def block_gathers(result, float8: bool) -> int:
        events = [e for e in result.traces[rank] if e.get("kind") == "collective" and e.get("phase") == "forward"]
        last = max(e["step"] for e in events)
        return sum(
            e["bytes"]
            for e in events
            if e["step"] == last
            and e["op"] == "all_gather"
            and e["module"].startswith("layers.")
            and e["dtype"].startswith("float8") == float8
        )

    return block_gathers(float8_result, True) / block_gathers(float32_result, False)


def units_not_regathered(result, rank: int = 0) -> set[str]:
    """Units (trace ``module`` labels) all-gathered on fsdp in forward but not in backward (01.2)."""
    events = [e for e in result.traces[rank] if e.get("kind") == "collective" and e["op"] == "all_gather"]
    last = max(e["step"] for e in events)
    gathered = {
        phase: {e["module"] for e in events if e["step"] == last and e["phase"] == phase}
        for phase in ("forward", "backward")
    }
    return gathered["forward"] - gathered["backward"]


def all_reduce_share(result, rank: int = 0) -> float:
    """Bytes all-reduced on dp_replicate over bytes reduce-scattered on fsdp in the last step (07.1)."""
    events = [e for e in result.traces[rank] if e.get("kind") == "collective" and e.get("phase") == "backward"]
    last = max(e["step"] for e in events)
    total = {
        key: sum(e["bytes"] for e in events if e["step"] == last and (e["op"], e["group"]) == key)
        for key in (("all_reduce", "dp_replicate"), ("reduce_scatter", "fsdp"))
    }
    if not total[("reduce_scatter", "fsdp")]:
        raise ValueError("this run reduce-scatters nothing on fsdp: 07.1 needs an HSDP run (M7)")
    return total[("all_reduce", "dp_replicate")] / total[("reduce_scatter", "fsdp")]


def fewer_saved_activations(results: Mapping[str, Any], labels: Iterable[str]) -> str:
    """The label of the run whose rank 0 saved the fewest activation bytes for backward (03.2; the
    worker measures them with ``hyper_parallel.recipes.activation_memory``)."""
    return min(labels, key=lambda label: results[label].metrics["saved_activation_bytes"])


def microbatches_for_bubble(schedule: str, pp: int, at_most: float) -> int:
    """The smallest number of microbatches whose bubble (the cost model's formula) is at most ``at_most`` (09.1)."""
    from hyper_parallel.cost_model.pipeline import bubble_fraction

    if not 0 < at_most < 1:
        raise ValueError(f"at_most is a fraction of the step in (0, 1), got {at_most}")
    m = 1
    while bubble_fraction(schedule, pp, m) > at_most:
        m += 1
    return m


def drifted(replica_spread: Mapping[str, float]) -> set[str]:
    """Parameters whose copies differ between the TP ranks (10's ``replica_spread``)."""
    return {name for name, spread in replica_spread.items() if spread > 0}


def tp_wire_bytes(result, rank: int = 0) -> float:
    """Bytes rank ``rank`` sends on the tp group in the last step (ring algorithms): TP and TP + SP send
    the same (03)."""
    tp_only = {rank: [e for e in result.traces.get(rank, []) if e.get("group") == "tp"]}
    return wire_bytes_per_rank(tp_only, rank)


def block_collectives(bench_result, config: str, impl: str = "ours") -> int:
    """Collectives on FSDP groups one block unit issued in the traced step of ``config`` (91.1); every
    block issues the same number, else ``ValueError``."""
    from hyper_parallel.mesh_dims import FSDP_GROUPS

    rows = [row for row in bench_result.rows if row["config"] == config]
    if not rows:
        raise ValueError(
            f"no configuration {config!r} in this benchmark; ran: {[r['config'] for r in bench_result.rows]}"
        )
    per_unit = rows[0]["communication"][impl]["per_unit"]
    counts = {
        sum(n for (_, group), n in c.items() if group in FSDP_GROUPS) for unit, c in per_unit.items() if unit != "root"
    }
    if len(counts) != 1:
        raise ValueError(f"blocks of {config} issue different numbers of collectives: {sorted(counts)}")
    return counts.pop()
