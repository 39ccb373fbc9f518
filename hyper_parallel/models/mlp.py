"""A residual MLP: the smallest model on which data parallelism and TP (colwise w1, rowwise w2) mean something."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass(frozen=True)
class MLPConfig:
    d_in: int = 16
    d_model: int = 32
    hidden: int = 64
    d_out: int = 8
    n_blocks: int = 2


class MLPBlock(nn.Module):
    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden)
        self.w2 = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.relu(self.w1(x)))


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
    """A fixed regression batch: inputs [batch, d_in], targets [batch, d_out]."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, config.d_in, generator=generator)
    y = torch.randn(batch, config.d_out, generator=generator)
    return x, y
