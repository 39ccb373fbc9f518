"""What lets `make gpu-smoke` run on an older torch than the one pinned (the CUDA images it meets ship 2.11):
each stand-in behaves as the 2.13 API it replaces, checked here against that API."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.fsdp._common_utils import collect_grad_tensors, replace_grad_tensors

from hyper_parallel import comm
from hyper_parallel.fsdp.unit_io import walk_collect_grad_tensors, walk_replace_grad_tensors
from launch.processes import local_agent


@dataclasses.dataclass
class Pair:
    first: Any
    second: Any


class Named(NamedTuple):
    x: Any
    y: Any


def nested(tensors: list[torch.Tensor]) -> Any:
    return (
        (tensors[0], [tensors[1], {"k": tensors[2], "pair": Pair(tensors[3], tensors[4])}]),
        {"named": Named(tensors[5], tensors[6]), "last": tensors[7], "count": 3},
    )


def same(tensors, others) -> bool:
    return len(tensors) == len(others) and all(a is b for a, b in zip(tensors, others))


def test_the_walk_finds_and_replaces_what_torch_does_in_the_same_order():
    tree = nested([torch.randn(2, requires_grad=i % 3 != 1) for i in range(8)])
    found = collect_grad_tensors(tree)
    assert len(found) == 5 and same(walk_collect_grad_tensors(tree), found)  # i = 1, 4, 7 need no gradient
    replacements = [t * 2 for t in found]
    ours = walk_replace_grad_tensors(tree, iter(replacements))
    torchs = replace_grad_tensors(tree, iter(replacements))
    assert same(collect_grad_tensors(ours), replacements) and same(collect_grad_tensors(torchs), replacements)
    assert type(ours[1]["named"]) is Named and type(ours[0][1][1]["pair"]) is Pair and ours[1]["count"] == 3


def test_the_agent_drops_shutdown_timeout_only_where_torchrun_lacks_it(monkeypatch):
    argv = ["--nnodes", "1", "--shutdown-timeout", "3", "-m", "entry", "--shutdown-timeout-of-entry"]
    assert local_agent.without_unknown_shutdown_timeout(argv) == argv  # this torch's torchrun has the flag
    older = argparse.ArgumentParser()
    older.add_argument("--nnodes")
    monkeypatch.setattr(local_agent, "get_args_parser", lambda: older)
    assert local_agent.without_unknown_shutdown_timeout(argv) == [
        "--nnodes", "1", "-m", "entry", "--shutdown-timeout-of-entry",
    ]  # fmt: skip


def test_collectives_take_the_old_names_where_the_new_ones_are_missing(monkeypatch):
    assert comm._all_gather_single() is dist.all_gather_single
    assert comm._reduce_scatter_single() is dist.reduce_scatter_single
    monkeypatch.delattr(dist, "all_gather_single")
    monkeypatch.delattr(dist, "reduce_scatter_single")
    assert comm._all_gather_single() is dist.all_gather_into_tensor
    assert comm._reduce_scatter_single() is dist.reduce_scatter_tensor
