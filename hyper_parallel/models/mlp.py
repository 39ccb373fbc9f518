"""A residual MLP over sequences: the smallest model on which DP, FSDP and TP+SP all mean something.

Each block is ``x + w2(relu(w1(norm(x))))``: w1 is the colwise and w2 the rowwise TP layer, and the
RMSNorm weight is the replicated parameter whose gradient sequence parallelism leaves partial.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from hyper_parallel.models.layers import RMSNorm


@dataclass(frozen=True)
class MLPConfig:
    d_in: int = 16
    d_model: int = 32
    hidden: int = 64
    d_out: int = 8
    n_blocks: int = 2
    seq_len: int = 8


class MLPBlock(nn.Module):
    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.norm = RMSNorm(d_model)
        self.w1 = nn.Linear(d_model, hidden)
        self.w2 = nn.Linear(hidden, d_model)
        with torch.no_grad():  # not all ones, so a wrongly reduced norm gradient shows in the numbers
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.relu(self.w1(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.config = config
        self.inp = nn.Linear(config.d_in, config.d_model)
        self.blocks = nn.ModuleList(MLPBlock(config.d_model, config.hidden) for _ in range(config.n_blocks))
        self.head = nn.Linear(config.d_model, config.d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def mlp_batch(config: MLPConfig, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression batch: inputs [batch, seq_len, d_in], targets [batch, seq_len, d_out]."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, config.seq_len, config.d_in, generator=generator, device=generator.device)
    y = torch.randn(batch, config.seq_len, config.d_out, generator=generator, device=generator.device)
    return x, y
