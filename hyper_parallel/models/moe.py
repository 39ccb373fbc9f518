"""A tiny mixture-of-experts layer: the single-process reference that expert parallelism must reproduce.

    x [batch, seq, d_model] -> tokens [T, d_model]
    router:   scores = softmax(tokens @ gate^T)  [T, num_experts]; keep the top_k per token
              (ties go to the lower expert index), weights renormalised among the top_k
    sort:     the T*top_k (token, expert) slots sorted by expert (stable: token order within an expert)
    experts:  GroupedExperts(routed [T*top_k, d_model], counts [num_experts]) runs expert e on its rows
    combine:  out[t] = sum_k weight[t, k] * expert_{idx[t, k]}(x[t])   (+ shared(x[t]))

The ``experts(routed, counts)`` call on tokens already sorted by expert is the seam expert parallelism
replaces (``hyper_parallel.parallel.ep``): routing, sorting and combining stay here, unchanged.
Parameter names are fixed (``router.gate.weight``, ``experts.w1``, ``experts.w2``, ``shared.w1.weight``,
``shared.w2.weight``): a parallel copy is compared with this reference by name.
Everything is initialised from the global RNG, so ``torch.manual_seed(s); MoE(config)`` builds the same
layer on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from hyper_parallel.models.layers import FeedForward


@dataclass(frozen=True)
class MoEConfig:
    d_model: int = 16
    hidden: int = 32
    num_experts: int = 4
    top_k: int = 2
    shared_expert: bool = True
    renormalize: bool = True
    """Renormalise the top_k weights to sum to 1. With top_k=1 that makes every weight 1 and the router
    gets no gradient; ``False`` keeps the raw softmax scores (the router then learns with top_k=1 too)."""

    def __post_init__(self) -> None:
        for name in ("d_model", "hidden", "num_experts", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {name}={getattr(self, name)}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} cannot exceed num_experts={self.num_experts}")


def expert_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One expert: ``silu(x @ w1) @ w2`` with ``w1 [d_model, hidden]``, ``w2 [hidden, d_model]``."""
    return F.silu(x @ w1) @ w2


def grouped_mlp(x: torch.Tensor, counts: list[int], w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` sorted by expert, ``counts[e]`` rows for expert e; ``w1 [E, d, h]``, ``w2 [E, h, d]``.

    Each expert runs on its own rows only (a zero count gives an empty chunk and a zero gradient)."""
    if len(counts) != w1.shape[0] or sum(counts) != x.shape[0]:
        raise ValueError(f"counts {counts} do not match {w1.shape[0]} experts and {x.shape[0]} rows")
    chunks = torch.split(x, counts, dim=0)
    outs = [expert_mlp(chunk, w1[e], w2[e]) for e, chunk in enumerate(chunks)]
    return torch.cat(outs, dim=0) if outs else x.new_zeros(0, w2.shape[-1])


class Router(nn.Module):
    """Top-k routing over softmax scores of a bias-free linear gate."""

    def __init__(self, d_model: int, num_experts: int, top_k: int, renormalize: bool = True) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, num_experts, bias=False)
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens [T, d]`` -> (weights [T, top_k], expert indices [T, top_k] int64).

        A stable descending sort instead of ``torch.topk``: equal scores keep index order, so ties
        deterministically go to the lower expert index on every rank and every backend."""
        scores = torch.softmax(self.gate(tokens), dim=-1)
        order = torch.sort(scores.detach(), dim=-1, descending=True, stable=True).indices
        indices = order[:, : self.top_k]
        weights = scores.gather(-1, indices)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, indices


class GroupedExperts(nn.Module):
    """``num_experts`` SiLU MLPs stored as two stacked weights ``w1 [E, d, h]`` and ``w2 [E, h, d]``."""

    def __init__(self, d_model: int, hidden: int, num_experts: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.randn(num_experts, d_model, hidden) * d_model**-0.5)
        self.w2 = nn.Parameter(torch.randn(num_experts, hidden, d_model) * hidden**-0.5)

    def forward(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``routed [N, d]`` sorted by expert, ``counts [E]`` (int64) rows per expert -> ``[N, d]``."""
        return grouped_mlp(routed, counts.tolist(), self.w1, self.w2)


class MoE(nn.Module):
    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.router = Router(config.d_model, config.num_experts, config.top_k, config.renormalize)
        self.experts = GroupedExperts(config.d_model, config.hidden, config.num_experts)
        self.shared = FeedForward(config.d_model, config.hidden) if config.shared_expert else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        weights, indices = self.router(tokens)  # [T, k], [T, k]
        slots = indices.reshape(-1)  # slot t*k + j -> its expert
        order = torch.argsort(slots, stable=True)  # slots sorted by expert
        token_of = torch.div(order, self.config.top_k, rounding_mode="floor")
        counts = torch.bincount(slots, minlength=self.config.num_experts)
        routed_out = self.experts(tokens[token_of], counts)  # [T*k, d], same order
        routed_out = routed_out * weights.reshape(-1)[order].unsqueeze(-1)
        out = torch.zeros_like(tokens).index_add(0, token_of, routed_out)
        if self.shared is not None:
            out = out + self.shared(tokens)
        return out.reshape(shape)
