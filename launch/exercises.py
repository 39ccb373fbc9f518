"""Exercises that check themselves: predict a number (or a set, or a mesh), then compare with the run.

A notebook asks, the learner writes an answer into a cell, and a checker compares it with the truth
taken from the run (its traces, its metrics) or from the cost model, never from a number typed into
the notebook:

    ask("10.1")                                        the question (Markdown)
    answer = None                                      the learner's cell; None = not answered yet
    check("10.1", answer, collective_count(results["M4"], "all_gather"))
    show_solution("10.1")                              the worked answer, folded until clicked

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
    "10.1": Exercise(
        "Predict: how many **all-gathers** does rank 0 of M4 issue per step (2 blocks + root, blocks "
        "reshard after forward, the root keeps its parameters)?",
        "forward gathers every unit once; backward gathers again only the units that resharded.",
        "5: 3 in forward (root, block 0, block 1) + 2 in backward (the blocks; the root kept its parameters).",
    ),
    "10.2": Exercise(
        "M1 (DDP) and M4 (FSDP) run the same MLP on 2 ranks. By what factor are the **parameter bytes per "
        "rank** of M1 larger than M4's? (the cost model's `memory.parameters`)",
        "FSDP keeps a 1/dp_shard shard of every parameter; DDP keeps all of it.",
        "2 = dp_shard: M1 keeps 37024 bytes per rank, M4 18512. Gradients shrink the same way; the "
        "transient all-gathered unit is what FSDP pays for it.",
    ),
    "11.1": Exercise(
        "Predict: how many **all-reduces on tp** does M2 (pure TP, 2 layers) issue in **forward**?",
        "one after every rowwise layer (wo, w2 in each layer), and one after the rowwise embedding.",
        "5 = 2 per layer x 2 layers + 1 for the embedding.",
    ),
    "11.2": Exercise(
        "Which run sends **fewer bytes on the wire** per rank and step, `'M2'` (TP) or `'M3'` (TP + SP)?",
        "on 2 ranks an all-reduce sends its whole buffer once (2(n-1)/n = 1), an all-gather or "
        "reduce-scatter half of it ((n-1)/n).",
        "M3: its all-gather + reduce-scatter pairs send what M2's all-reduces send, but M2's backward "
        "also all-reduces the input gradient of every colwise layer (wq, wk, wv, w1).",
    ),
    "13.1": Exercise(
        "Predict: how many **all-gathers** does rank 0 of M7 (HSDP 2 x 2, 2 layers + root) issue per step?",
        "HSDP gathers only on fsdp, exactly as FSDP does; dp_replicate is never gathered.",
        "5: 3 in forward + 2 in backward, as M4; HSDP adds 3 all-reduces on dp_replicate, no all-gather.",
    ),
    "13.2": Exercise(
        "Pick degrees for `llama-8b-like` on **64 ranks** with HSDP (`dp_replicate > 1`, tp = cp = 1) so "
        "that every rank's **training state** (parameters + gradients + Adam state, the cost model's "
        "`memory`) fits in **16 GiB**. Answer a dict, e.g. `{'dp_replicate': 32, 'dp_shard': 2}`.",
        "the state shrinks with dp_shard, not with dp_replicate: 8 B parameters in bf16 with fp32 Adam "
        "state are about 120 GiB before sharding.",
        "any dp_shard >= 8: {'dp_replicate': 8, 'dp_shard': 8} keeps 15.0 GiB per rank, dp_shard = 4 "
        "keeps 29.9 GiB. (Activations depend on the batch per rank, not on how parameters are sharded.)",
    ),
    "12.1": Exercise(
        "With cp = 4 the sequence is cut into 8 chunks. **Which chunks** does cp rank 1 hold? "
        "Answer a set, e.g. `{1, 2}`.",
        "rank i holds chunk i and its mirror image 2cp-1-i, so every rank gets as much of the causal mask.",
        "{1, 6}: rank 1 holds chunk 1 and chunk 2*4-1-1 = 6.",
    ),
    "14.1": Exercise(
        "Predict: how many **all-to-alls on ep** does rank 0 of S1 issue per step (one MoE layer)?",
        "forward: the token counts, the dispatch, the combine; backward: the two token exchanges reversed.",
        "5: 3 in forward (counts, dispatch, combine) + 2 in backward (the counts need no gradient).",
    ),
    "14.2": Exercise(
        "In S2, ep x etp = 2 x 2 already spans the 4 ranks, so efsdp = 1. How many collectives does "
        "rank 0 issue **on efsdp** (the expert unit's FSDP group) per step?",
        "shard_size 1 and dp_size 1: the case where the decision table says no gradient communication.",
        "0: nothing to gather (efsdp = 1) and nothing to reduce (every expert weight lives on one rank).",
    ),
    "03.1": Exercise(
        "Which parameters **drift** (differ between the two TP ranks) without the fix? Answer a set of names, "
        "e.g. `{'blocks.0.w1.weight'}`.",
        "TP-replicated parameters that see only a sequence chunk under SP.",
        "the norm weights and the rowwise layers' biases of every block (blocks.N.norm.weight, blocks.N.w2.bias):"
        " replicated on tp, but each TP rank computes their gradient from its own sequence chunk only.",
    ),
    "03.2": Exercise(
        "How many **extra all-reduces on tp** does the fix add per step on rank 0?",
        "one per fully_shard unit that has parameters with partial gradients.",
        "2: one all-reduce over tp per block unit (blocks.0, blocks.1), each summing that block's partial "
        "gradients (norm weight and w2 bias) in one buffer; the root unit has none (the table above: 0 -> 2).",
    ),
    "01.1": Exercise(
        "With `world_size=8, dp_shard=8, ep=2` (etp = 1), how many ranks are in one **efsdp** group (the ranks "
        "that shard the same experts' weights)?",
        "EP borrows its ranks from dp_shard * cp * tp; what is left over shards the experts: "
        "efsdp = dp_shard * cp * tp / (ep * etp).",
        "4 = 8 / 2: two ep ranks hold different experts, and each expert's weights are sharded over 4 ranks.",
    ),
    "02.1": Exercise(
        "A unit on 8 ranks with shard_size 4 and dp_size 2: what is its gradient reduction? Answer as the "
        "table writes it, e.g. `'RS(2) + AR(4)'`.",
        "shard first (reduce-scatter in the shard group), then all-reduce the shard over the replicas.",
        "RS(4) + AR(2): HSDP with fsdp = 4, dp_replicate = 2.",
    ),
    "95.1": Exercise(
        "Predict: under HSDP 2 x 2 (the 4-rank benchmark), how many collectives on the FSDP groups "
        "(fsdp and dp_replicate) does **one block** issue per step, ours or torch's?",
        "what a block does: gathered for forward, gathered again for backward (it resharded), its gradients "
        "reduce-scattered, and HSDP's extra step across replicas.",
        "4: 2 all-gathers and 1 reduce-scatter on fsdp, 1 all-reduce of the shard on dp_replicate (the root: 3, "
        "it is not gathered again in backward).",
    ),
    "90.1": Exercise(
        "Is `world_size=8, dp_shard=2, cp=2, tp=2, ep=2, etp=1` a valid mesh? Answer True or False.",
        "with etp = 1 EP borrows from dp_shard * cp * tp and ep % (cp * tp) must be 0.",
        "False: ep = 2 is not a multiple of cp * tp = 4 (with etp = 1 every EP group must hold whole cp x tp blocks).",
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
    from hyper_parallel.mesh import ParallelDims

    exercise(key)
    if answer is None:
        return _unanswered(key)
    if not isinstance(answer, Mapping):
        return _verdict(key, answer, False, "", "a mesh is a dict of degrees")
    try:
        dims = ParallelDims(world_size=world_size, **dict(answer))
        memory = estimate(get_model(model), dims).memory
        total = memory.parameters + memory.gradients + memory.optimizer
    except (TypeError, ValueError) as error:
        print(f"✘ {key}: {dict(answer)} is not a valid mesh of {world_size} ranks: {error}")
        return WRONG
    for name, rule in (need or {}).items():
        value = getattr(dims, name)
        if (rule == ">1" and value <= 1) or (isinstance(rule, int) and value != rule):
            print(
                f"✘ {key}: {name}={value}, but the exercise asks for {name} {rule if rule == '>1' else '= ' + str(rule)}."
            )
            return WRONG
    source = f"the cost model: {total / GIB:.1f} GiB of state per rank against {budget_gib} GiB"
    return _verdict(key, dict(answer), total <= budget_gib * GIB, f"{dict(answer)} fits", source)


# ---------------------------------------------------------------- truths taken from a run


def collective_count(
    result, op: str | None = None, group: str | None = None, phase: str | None = None, rank: int = 0
) -> int:
    """How many collectives (of ``op``, on ``group``, in ``phase``; None: any) rank ``rank`` issued in the
    run's last step, from its trace."""
    from launch.notebook_tables import collective_counts

    return sum(
        n
        for (p, o, g), n in collective_counts(result, rank=rank).items()
        if (op is None or o == op) and (group is None or g == group) and (phase is None or p == phase)
    )


def parameter_bytes(result) -> int:
    """Parameter bytes one rank keeps between steps, by the cost model for the run's recipe and mesh."""
    from hyper_parallel.cost_model import estimate, recipe_model
    from hyper_parallel.mesh import ParallelDims

    degrees = result.metrics["degrees"]
    dims = ParallelDims(**{k: v for k, v in degrees.items() if k in ParallelDims.__dataclass_fields__})
    return estimate(recipe_model(result.metrics["recipe"]), dims).memory.parameters


def wire_bytes_per_rank(result, rank: int = 0) -> float:
    """Bytes rank ``rank`` sends in the last step with ring algorithms (all-reduce 2(n-1)/n of its buffer,
    the other collectives (n-1)/n): what 11.2 compares."""
    from hyper_parallel.cost_model import wire_factor

    traces = result if isinstance(result, Mapping) else result.traces
    events = [e for e in traces.get(rank, []) if e.get("kind") == "collective" and e.get("phase") != "init"]
    if not events:
        return 0.0
    last = max(e["step"] for e in events)
    return sum(e["bytes"] * wire_factor(e["op"], len(e["ranks"])) for e in events if e["step"] == last)


def drifted(replica_spread: Mapping[str, float]) -> set[str]:
    """Parameters whose copies differ between the TP ranks (03's ``replica_spread``)."""
    return {name for name, spread in replica_spread.items() if spread > 0}


def fewer_wire_bytes(results: Mapping[str, Any], labels: Iterable[str]) -> str:
    """The label of the run that sends the fewest bytes per rank (11.2)."""
    return min(labels, key=lambda label: wire_bytes_per_rank(results[label]))


def block_collectives(bench_result, config: str, impl: str = "ours") -> int:
    """Collectives on FSDP groups one block unit issued in the traced step of ``config`` (95.1); every
    block issues the same number, else ``ValueError``."""
    from launch.bench import FSDP_GROUPS

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
