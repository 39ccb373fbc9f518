"""torchrun worker for tests/test_fsdp_edge_cases.py: unusual but legitimate training loops, each
compared with one process running the same loop on the global batch (gradients of every parameter).

The cases exercise fully_shard's frozen-parameter, list-unit and overlap code (tests/test_fsdp_edge_cases.py
says what each guards). Output: ``OUT/edge_rank{r}.json``: case -> max |grad -
reference| over all parameters, or the traceback.

    torchrun --nproc-per-node 2 tests/workers/fsdp_edge_cases.py --out DIR
"""

from __future__ import annotations

import argparse
import copy
import json
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.checkpoint import checkpoint

from hyper_parallel import trace
from hyper_parallel.fsdp import FullyShardModule, fully_shard
from hyper_parallel.mesh_dims import MeshDim

D, ROWS = 16, 4  # ROWS per rank; the reference sees ROWS * world rows
CASES: dict[str, Callable] = {}


def case(fn: Callable) -> Callable:
    CASES[fn.__name__] = fn
    return fn


class Net(nn.Module):
    """inp -> blocks -> out; ``feature`` keeps block 1's output (a loss may use it instead of the output)."""

    def __init__(self, blocks: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(D, D)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(D, D), nn.Tanh()) for _ in range(blocks))
        self.out = nn.Linear(D, D)
        self.reentrant = False
        self.feature = None

    def forward(self, x):
        h = self.inp(x)
        for index, block in enumerate(self.blocks):
            h = checkpoint(block, h, use_reentrant=True) if self.reentrant else block(h)
            if index == 1:
                self.feature = h
        return self.out(h)


def inputs(count: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(1)
    full = [torch.randn(ROWS * dist.get_world_size(), D) for _ in range(count)]
    rank = dist.get_rank()
    return full, [x[rank * ROWS : (rank + 1) * ROWS] for x in full]


def grad_diff(model: nn.Module, reference: nn.Module) -> float:
    worst = 0.0
    for (_name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        if p.grad is None and q.grad is None:
            continue
        if (p.grad is None) != (q.grad is None):
            return float("inf")
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        worst = max(worst, (grad - q.grad).abs().max().item())
    return worst


def compare(
    build: Callable[[], nn.Module],
    shard: Callable[[nn.Module], None],
    run: Callable[[nn.Module, list[torch.Tensor]], None],
    count: int = 2,
) -> float:
    torch.manual_seed(0)
    model = build()
    reference = copy.deepcopy(model)
    shard(model)
    full, local = inputs(count)
    run(reference, full)
    run(model, local)
    return grad_diff(model, reference)


def per_block(model: Net) -> None:
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)


@case
def list_unit_frozen_first():
    """fully_shard([A, B]) with A frozen: B's input gradient arrives first; A's backward still needs A."""

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre, self.a, self.b = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)

        def forward(self, x):
            return self.b(torch.tanh(self.a(torch.tanh(self.pre(x)))))

    def build():
        model = Two()
        model.a.requires_grad_(False)
        return model

    def shard(model):
        fully_shard([model.a, model.b])
        fully_shard(model)

    return compare(build, shard, lambda m, xs: m(xs[0]).pow(2).mean().backward())


@case
def frozen_unit_called_twice():
    """A frozen encoder used twice in one forward (siamese): resharded only after both calls' backward."""

    class Siamese(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre = nn.Linear(D, D)
            self.enc = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D))

        def forward(self, x):
            h = self.pre(x)
            return self.enc(h) * self.enc(h * 2)

    def build():
        model = Siamese()
        model.enc.requires_grad_(False)
        return model

    def shard(model):
        fully_shard(model.enc)
        fully_shard(model)

    return compare(build, shard, lambda m, xs: m(xs[0]).pow(2).mean().backward())


@case
def frozen_layer_two_backwards_of_one_forward():
    """A unit with a frozen layer, two backwards through one forward (retain_graph): the second must
    gather the unit again, not find it resharded by state left over from the first."""

    def build():
        model = Net()
        model.blocks[1][0].weight.requires_grad_(False)
        return model

    def run(model, xs):
        out = model(xs[0])
        out.pow(2).mean().backward(retain_graph=True)
        out.abs().mean().backward()

    return compare(build, per_block, run)


@case
def loss_on_a_feature_not_the_output():
    """The loss uses block 1's output only: the root's output gets no gradient, its hook never fires."""

    def run(model, xs):
        for x in xs:
            for p in model.parameters():
                p.grad = None
            model(x)
            model.feature.pow(2).mean().backward()

    return compare(Net, per_block, run)


class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("boom")


@case
def backward_raises_then_training_goes_on():
    """A backward that raises (caught by the user), then two normal steps (their gradients compared)."""

    def run(model, xs):
        try:  # raises at the very end of backward, after every unit's hooks ran and reductions were issued
            model(Boom.apply(xs[0].clone().requires_grad_())).pow(2).mean().backward()
        except RuntimeError:
            pass
        for p in model.parameters():
            p.grad = None
        for x in xs[1:]:
            for p in model.parameters():
                p.grad = None
            model(x).pow(2).mean().backward()

    return compare(Net, per_block, run, count=3)


@case
def reshard_to_subgroup_then_weights_change():
    """reshard_after_forward=2 (on 4 ranks), a forward without backward, a weight change, a forward: the
    second forward must read the new weights, not the shard kept after the first."""

    def shard(model):
        for block in model.blocks:
            fully_shard(block, reshard_after_forward=2)
        fully_shard(model, reshard_after_forward=2)

    def run(model, xs):
        model(xs[0])
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5)
        model(xs[1]).pow(2).mean().backward()

    return compare(Net, shard, run)


@case
def compiled_model_under_torch_compile():
    """``torch.compile`` (eager backend: dynamo's graphs, no code generation) over a per-block fully_shard
    model: the hooks' collectives must run in every step, the replayed ones too, so each step gives the
    reference's gradients and eager's all-gathers: by hand, forward 1 (the root, kept) + 3 blocks,
    backward 3 blocks = 7."""

    def run(model, xs):
        sharded = isinstance(model, FullyShardModule)
        compiled = torch.compile(model, backend="eager") if sharded else model
        for x in xs:
            with trace.record() as recorder:
                compiled(x).pow(2).mean().backward()
            gathers = sum(1 for e in recorder.events if e["kind"] == "collective" and e["op"] == "all_gather")
            if sharded and gathers != 7:
                raise RuntimeError(f"{gathers} all-gathers in a compiled step, 7 expected")

    return compare(Net, per_block, run, count=3)

    return compare(Net, per_block, run)


@case
def reentrant_checkpointing_keeps_its_gathers():
    """Reentrant checkpointing recomputes each block inside backward; that order must not be taken for the
    forward order (from step 2 on every block would prefetch the block just done). All-gathers per step,
    3 blocks + root, by hand: forward 1 (root, kept) + 3; backward per block 2 (the recompute gathers, its
    post-forward reshards, its pre-backward gathers again) = 10, in every step."""
    torch.manual_seed(0)
    model = Net()
    model.reentrant = True
    per_block(model)
    _, local = inputs(3)
    counts = []
    for x in local:
        with trace.record() as recorder:
            model(x.requires_grad_()).pow(2).mean().backward()
        counts.append(sum(1 for e in recorder.events if e["kind"] == "collective" and e["op"] == "all_gather"))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=(MeshDim.FSDP,))
    results = {}
    for name, fn in CASES.items():
        try:
            results[name] = fn()
        except Exception:  # recorded: the test shows the traceback of the failing case
            results[name] = {"error": traceback.format_exc()}
        dist.barrier()
    (Path(args.out) / f"edge_rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
